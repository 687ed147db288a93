"""Mock AMD GPU pieces for CI: rdna3/ decodes and interprets the exact RDNA3 machine code LLVM emitted."""
