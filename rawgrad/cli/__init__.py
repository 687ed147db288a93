"""The command line and the tools behind it: `python -m rawgrad [demo | info | doctor | smoke | infer ... |
bench ...]` (main.py), the benchmarks (bench*.py), the setup check (doctor.py) and the NV bring-up run with
its Tensor steps (nv_smoke.py).

This is the top layer: it may import every other part of rawgrad, and nothing in rawgrad imports it
(tests/test_layering.py holds the order dtype/config <- compiler <- hcq <- drivers <- tensor <- jit <- nn <-
models <- cli)."""
