"""RDNA3 (gfx1100) machine code without a GPU: decode.py sizes and decodes instructions, optable.py is the
generated (format, opcode) -> mnemonic table (tools/amd_optable.py), interp.py runs a loaded kernel in numpy,
corpus.py holds the hand-written kernels the table and the tests come from, listing.py zips LLVM's assembly
listing with our decode."""
