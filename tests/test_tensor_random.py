"""The counter-based generator: Threefry-2x32 known answers, seeding, and the distributions."""
import numpy as np
import pytest

from rawgrad.dtype import dtypes
from rawgrad.tensor.tensor import Tensor, threefry2x32

# Known-answer vectors for threefry2x32 with 20 rounds (Random123's kat_vectors):
# (counter0, counter1, key0, key1) -> (out0, out1)
KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xC4923A9C, 0x483DF7A0)),
]


def test_threefry_known_answers(check):
    cols = [Tensor(np.array([v[0][i] for v in KAT], np.uint32)) for i in range(4)]
    x0, x1 = threefry2x32(*cols)
    assert x0.dtype == dtypes.uint32
    check([x0, x1], [np.array([v[1][i] for v in KAT], np.uint32) for i in range(2)])


def test_rand_is_seeded_and_uniform():
    Tensor.manual_seed(42)
    a, b = Tensor.rand(2000), Tensor.rand(3, 5)
    Tensor.manual_seed(42)
    a2 = Tensor.rand(2000)
    Tensor.realize(a, b, a2)
    x = a.numpy()
    assert a.dtype == dtypes.float32 and b.shape == (3, 5)
    np.testing.assert_array_equal(x, a2.numpy())  # same seed, same stream
    assert not np.array_equal(x[:15], b.numpy().reshape(-1))  # each call advances the counter
    assert x.min() >= 0.0 and x.max() < 1.0 and abs(x.mean() - 0.5) < 0.03
    assert len(np.unique(x)) > 1990


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16, dtypes.float64], ids=str)
def test_rand_low_precision_never_reaches_one(dt):
    x = Tensor.rand(4001, dtype=dt)  # odd count: the last Threefry block is half used
    assert x.dtype == dt and x.shape == (4001,)
    v = x.numpy()
    assert v.min() >= 0.0 and v.max() < 1.0 and abs(v.mean() - 0.5) < 0.03


def test_distributions():
    Tensor.manual_seed(7)
    n = Tensor.randn(100, 100)
    i = Tensor.randint(1000, low=-3, high=5)
    u = Tensor.uniform(1000, low=2.0, high=4.0)
    g = Tensor.normal(2000, mean=3.0, std=0.5)
    like = Tensor.ones(2, 3, dtype=dtypes.float16)
    rl, nl = like.rand_like(), like.randn_like()
    ku = Tensor.kaiming_uniform(8, 4, 3, 3)
    Tensor.realize(n, i, u, g, rl, nl, ku)
    x = n.numpy()
    assert abs(x.mean()) < 0.05 and abs(x.std() - 1) < 0.05 and np.isfinite(x).all()
    iv = i.numpy()
    assert i.dtype == dtypes.int32 and iv.min() == -3 and iv.max() == 4
    uv = u.numpy()
    assert uv.min() >= 2.0 and uv.max() < 4.0
    gv = g.numpy()
    assert abs(gv.mean() - 3.0) < 0.05 and abs(gv.std() - 0.5) < 0.05
    assert rl.dtype == dtypes.float16 and rl.shape == (2, 3) and nl.dtype == dtypes.float16
    bound = np.sqrt(3) * np.sqrt(2 / (1 + 0.01 ** 2)) / np.sqrt(36)
    assert np.abs(ku.numpy()).max() <= bound and Tensor.glorot_uniform(4, 5).shape == (4, 5)
    with pytest.raises(TypeError, match="float dtype"):
        Tensor.rand(3, dtype=dtypes.int32)
    with pytest.raises(ValueError, match="low < high"):
        Tensor.randint(3, low=2, high=2)
