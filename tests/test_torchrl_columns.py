"""TensorDict <-> the plane's columnar schema (conduit.runtime.torchrl.columns): a round trip keeps every
leaf, dtype and per-step shape; contiguous CPU tensors are mapped without a copy; bad input is refused
naming the key."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tensordict")
pytest.importorskip("torchrl")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import NonTensorData, TensorDict

from conduit.errors import SchemaError
from conduit.runtime.schema import Schema
from conduit.runtime.torchrl.columns import (
    SEPARATOR,
    TensorDictLayout,
    flatten_key,
    numpy_dtype,
    unflatten_key,
)

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.float32, torch.float64]
NAMES = st.text(alphabet="abcdefgh_xyz0123", min_size=1, max_size=6)


def _tensor(draw, batch, dtype, shape):
    n = int(np.prod(batch + shape, dtype=np.int64))
    raw = np.frombuffer(draw(st.binary(min_size=n * dtype.itemsize, max_size=n * dtype.itemsize)), np.uint8)
    if dtype == torch.bool:
        return torch.from_numpy((raw % 2).astype(np.bool_).reshape(batch + shape))
    return torch.from_numpy(raw.copy().view(numpy_dtype(dtype)).reshape(batch + shape))


@st.composite
def tensordicts(draw, depth=2):
    batch = draw(st.lists(st.integers(1, 3), min_size=0, max_size=2))

    def tree(d):
        keys = draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))
        out = {}
        for k in keys:
            if d > 0 and draw(st.booleans()):
                out[k] = TensorDict(tree(d - 1), batch_size=batch)
            else:
                dtype = draw(st.sampled_from(DTYPES))
                shape = draw(st.lists(st.integers(0, 3), max_size=2))
                out[k] = _tensor(draw, batch, dtype, shape)
        return out

    return TensorDict(tree(depth), batch_size=batch)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(td=tensordicts())
def test_round_trip_keeps_every_leaf_dtype_and_shape(td):
    layout = TensorDictLayout.infer(td)
    assert TensorDictLayout.from_dict(layout.to_dict()) == layout
    cols = layout.columns(td)
    steps = layout.steps(td)
    assert set(cols) == set(layout.schema.names)
    assert layout.schema.validate(cols) == steps
    back = layout.tensordict(cols)
    flat = td.reshape(-1) if td.batch_dims else td.unsqueeze(0)
    assert back.batch_size == torch.Size([steps])
    assert set(back.keys(True, True)) == set(flat.keys(True, True))
    for key in flat.keys(True, True):
        assert back.get(key).dtype == flat.get(key).dtype
        # bytes, not values: random bits include NaNs
        assert back.get(key).numpy().tobytes() == flat.get(key).contiguous().numpy().tobytes(), key
    # contiguous CPU tensors: the columns are views of the tensors, and the tensors of the columns
    for key in flat.keys(True, True):
        name = flatten_key(key)
        if cols[name].size:
            assert np.shares_memory(cols[name], td.get(key).numpy())
            assert back.get(key).data_ptr() == cols[name].ctypes.data


@given(parts=st.lists(NAMES, min_size=1, max_size=4))
def test_key_names_round_trip(parts):
    key = parts[0] if len(parts) == 1 else tuple(parts)
    assert unflatten_key(flatten_key(key)) == key


def test_a_non_contiguous_tensor_is_copied_once_and_still_maps():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    td = TensorDict({"obs": base[:, ::2]}, batch_size=[4])
    layout = TensorDictLayout.infer(td)
    col = layout.columns(td)["obs"]
    assert col.flags.c_contiguous and not np.shares_memory(col, base.numpy())
    assert torch.equal(layout.tensordict({"obs": col})["obs"], base[:, ::2])


def test_schema_of_a_collector_batch():
    td = TensorDict({"observation": torch.zeros(2, 5, 84, 84, 4, dtype=torch.uint8),
                     "next": {"reward": torch.zeros(2, 5, 1), "done": torch.zeros(2, 5, 1, dtype=torch.bool)},
                     "collector": {"traj_ids": torch.zeros(2, 5, dtype=torch.int64)}}, batch_size=[2, 5])
    layout = TensorDictLayout.infer(td)
    assert layout.schema == Schema.of({"observation": ((84, 84, 4), np.uint8), f"next{SEPARATOR}reward": ((1,), np.float32),
                                       f"next{SEPARATOR}done": ((1,), np.bool_),
                                       f"collector{SEPARATOR}traj_ids": ((), np.int64)})
    assert layout.steps(td) == 10


@pytest.mark.parametrize("td, names", [
    (lambda: TensorDict({"a.b": torch.zeros(3)}, batch_size=[3]), ["a.b", "contains '.'"]),
    (lambda: TensorDict({"x": torch.zeros(3, dtype=torch.bfloat16)}, batch_size=[3]), ["'x'", "bfloat16"]),
    (lambda: TensorDict({"x": torch.zeros(3), "s": NonTensorData("hi", batch_size=[3])}, batch_size=[3]),
     ["'s'", "not a tensor"]),
])
def test_bad_keys_are_refused_naming_the_key(td, names):
    with pytest.raises(SchemaError) as err:
        TensorDictLayout.infer(td())
    for n in names:
        assert n in str(err.value)


def test_a_batch_that_differs_from_the_layout_is_refused_naming_the_key():
    layout = TensorDictLayout.infer(TensorDict({"next": {"obs": torch.zeros(2, 4)}, "a": torch.zeros(2)}, [2]))
    with pytest.raises(SchemaError, match=r"\('next', 'obs'\).*dtype float64"):
        layout.columns(TensorDict({"next": {"obs": torch.zeros(2, 4, dtype=torch.float64)}, "a": torch.zeros(2)}, [2]))
    with pytest.raises(SchemaError, match=r"\('next', 'obs'\).*per-step shape \[5\]"):
        layout.columns(TensorDict({"next": {"obs": torch.zeros(2, 5)}, "a": torch.zeros(2)}, [2]))
    with pytest.raises(SchemaError, match=r"'a' is missing"):
        layout.columns(TensorDict({"next": {"obs": torch.zeros(2, 4)}}, [2]))
    with pytest.raises(SchemaError, match=r"\['b'\] are not in the layout"):
        layout.columns(TensorDict({"next": {"obs": torch.zeros(2, 4)}, "a": torch.zeros(2), "b": torch.zeros(2)}, [2]))


def test_without_torchrl_the_package_names_the_extra():
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torchrl", "tensordict"):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None

        sys.meta_path.insert(0, Block())
        from conduit._extras import MissingExtraError
        try:
            import conduit.runtime.torchrl  # noqa: F401
        except MissingExtraError as exc:
            assert isinstance(exc, ImportError)
            print(exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "pip install 'conduit-rl[torchrl]'" in out.stdout and "tensordict" in out.stdout, out.stdout + out.stderr
