"""Weight files into backend buffers: dtype conversion, chunked reads, allocation subsets,
staging copies, errors."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
from sdplan.core.runtime.weights import WeightFile, plain_read_seconds, runtime_dtype  # noqa: E402

RNG = np.random.default_rng(4)


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray | bytes, tuple[int, ...]]]) -> None:
    """Minimal safetensors writer (supports BF16 given as raw bytes)."""
    header, blobs, off = {}, [], 0
    for name, (dtype, data, shape) in tensors.items():
        raw = data if isinstance(data, bytes) else data.tobytes()
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def bf16_bytes(a: np.ndarray) -> bytes:
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()


@pytest.fixture(scope="module")
def cpu():
    mgr = G.BackendManager(1)
    yield mgr.get("CPU")
    mgr.close()


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    a = RNG.standard_normal((300, 64)).astype(np.float32)
    b = RNG.standard_normal((40, 64)).astype(np.float16)
    c = RNG.standard_normal((32, 64)).astype(np.float32)
    bias = RNG.standard_normal(64).astype(np.float16)
    path = tmp_path_factory.mktemp("wt") / "w.safetensors"
    write_safetensors(path, {"a": ("F32", a, a.shape), "b": ("F16", b, b.shape),
                             "c": ("BF16", bf16_bytes(c), c.shape), "bias": ("F16", bias, bias.shape)})
    return path, {"a": a, "b": b, "c": c, "bias": bias}


def values(store, name: str, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    return np.frombuffer(store.get_bytes(name), {"f32": np.float32, "f16": np.float16}[dtype]).reshape(shape)


@pytest.fixture
def no_bf16_kernel():
    """The dtype policy of a CPU without sdplan's bf16 kernel (``SDPLAN_BF16_KERNEL=off``)."""
    before = G.bf16_kernel()
    G.set_bf16_kernel("off")
    yield
    G.set_bf16_kernel(before)


def test_default_dtypes_and_reads_with_conversion_in_small_chunks(cpu, sample, no_bf16_kernel) -> None:
    path, ref = sample
    wf = WeightFile(path, backend=cpu)
    assert wf.dtypes["bias"] == "f32"  # vectors are held in f32
    wf.dtypes.update(a="f16", c="f32")  # force conversions f32->f16 and bf16->f32
    store = wf.new_store()
    store.allocate(list(wf.infos), cpu)
    assert wf.read(store, list(wf.infos), chunk_bytes=4096) == path.stat().st_size - 8 - _header_len(path)
    np.testing.assert_array_equal(values(store, "a", (300, 64), "f16"), ref["a"].astype(np.float16))
    np.testing.assert_array_equal(values(store, "b", (40, 64), "f16"), ref["b"])
    c_bf16 = (np.frombuffer(bf16_bytes(ref["c"]), np.uint16).astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(values(store, "c", (32, 64), "f32"), c_bf16.reshape(32, 64))
    np.testing.assert_array_equal(values(store, "bias", (64,), "f32"), ref["bias"].astype(np.float32))


def _header_len(path: Path) -> int:
    return struct.unpack("<Q", path.read_bytes()[:8])[0]


def test_quantizing_on_load(cpu, sample) -> None:
    path, ref = sample
    wf = WeightFile(path, names=["a"], dtypes={"a": "q8_0"})
    store = wf.new_store()
    store.allocate(["a"], cpu)
    wf.read(store, ["a"])
    assert len(store.get_bytes("a")) == G.dtype_size("q8_0", 64) * 300
    g = G.Graph([cpu])
    x = np.eye(64, dtype=np.float32)[:3]
    xi = g.input("x", (3, 64))
    g.output("y", g.mul_mat(store.tensor("a"), xi))
    g.set_input("x", x)
    g.compute()
    np.testing.assert_allclose(g.get_output("y"), ref["a"][:, :3].T, atol=0.03)


def test_subset_allocation_staging_copy_and_free(cpu, sample) -> None:
    path, ref = sample
    wf = WeightFile(path)
    params, runtime = wf.new_store(), wf.new_store()
    pb = params.allocate(list(wf.infos), cpu)
    wf.read(params, list(wf.infos))
    rb = runtime.allocate(["a", "b"], cpu)
    assert rb.size >= params.nbytes("a") + params.nbytes("b") and not runtime.resident("c")
    assert runtime.copy_from(params, ["a", "b"]) == params.nbytes("a") + params.nbytes("b")
    assert runtime.get_bytes("b") == params.get_bytes("b")
    rb.free()
    assert rb.freed and rb.size == 0 and not runtime.resident("a")
    pb.free()


def test_errors_name_the_tensor_or_file(cpu, sample, tmp_path) -> None:
    path, _ = sample
    wf = WeightFile(path)
    store = wf.new_store()
    with pytest.raises(ValueError, match="'a' is not allocated"):
        wf.read(store, ["a"])
    buf = store.allocate(["a"], cpu)
    with pytest.raises(ValueError, match="already allocated"):
        store.allocate(["a"], cpu)
    short = tmp_path / "short.safetensors"
    short.write_bytes(path.read_bytes())
    with pytest.raises(RuntimeError, match="cannot open"):
        store.read(str(tmp_path / "missing"), [("a", 0, "f32")])
    with pytest.raises(RuntimeError, match="file ends before"):
        store.read(str(short), [("a", short.stat().st_size - 100, "f32")])
    buf.free()
    with pytest.raises(ValueError, match="unknown dtype"):
        G.WeightStore([("x", "f7", (2,))])


def test_runtime_dtype_policy(cpu, sample) -> None:
    wf = WeightFile(sample[0])
    assert runtime_dtype(wf.infos["c"], cpu) == "bf16"  # the CPU multiplies bf16
    assert runtime_dtype(wf.infos["b"]) == "f16"
    assert G.supports_mul_mat(cpu, "q4_k")


def test_plain_read_counts_the_whole_file(sample) -> None:
    n, seconds = plain_read_seconds(sample[0])
    assert n == sample[0].stat().st_size and seconds >= 0


def test_names_longer_than_ggml_names(cpu, tmp_path) -> None:
    """Names past ggml's 63 bytes (two that share their last 63 bytes) load, keep their full
    names everywhere and stay distinct tensors in a graph."""
    from sdplan.core.runtime import graph as gr

    tail = ".double_blocks.12.img_attn.norm.query_norm.scale.and_some_more_words"
    names = ["model.diffusion_model" + tail, "model.other_diffusion" + tail]
    assert all(len(n.encode()) > 63 for n in names) and names[0][-63:] == names[1][-63:]
    arrays = {n: RNG.standard_normal(8).astype(np.float32) for n in names}
    path = tmp_path / "long.safetensors"
    write_safetensors(path, {n: ("F32", a, a.shape) for n, a in arrays.items()})
    wf = WeightFile(path)
    store = wf.new_store()
    assert sorted(store.names) == sorted(names)
    buf = store.allocate(names, cpu)
    assert sorted(buf.names) == sorted(names)
    wf.read(store, names)
    for n in names:
        np.testing.assert_array_equal(values(store, n, (8,), "f32"), arrays[n])
        assert store.tensor(n).name == n
    g = gr.new_graph([cpu])
    x = g.input("x", (8,))
    g.output("y", g.add(g.mul(x, store.tensor(names[0])), store.tensor(names[1])))
    g.build()
    assert sorted(g.weight_names) == sorted(names)
    xv = RNG.standard_normal(8).astype(np.float32)
    g.set_input("x", xv)
    g.compute()
    np.testing.assert_allclose(g.get_output("y"), xv * arrays[names[0]] + arrays[names[1]], rtol=1e-6)
    buf.free()
    with pytest.raises(RuntimeError, match=r"weight 'model\.(diffusion_model|other_diffusion)\.double_blocks"):
        g.compute()  # the error names the weight in full


def test_weight_file_from_arrays(cpu, no_bf16_kernel) -> None:
    """Arrays in memory load like a file's tensors, with the same dtype policy."""
    arrays = {"m64": RNG.standard_normal((8, 32)), "m16": RNG.standard_normal((8, 32)).astype(np.float16),
              "v32": RNG.standard_normal(32).astype(np.float32), "k": RNG.standard_normal((4, 2, 3, 3))}
    wf = WeightFile.from_arrays(arrays, "net.pth", backend=cpu)
    assert wf.dtypes == {"m64": "f32", "m16": "f16", "v32": "f32", "k": "f32"}
    store = wf.new_store()
    store.allocate(list(arrays), cpu)
    assert wf.read(store, list(arrays)) == sum(a.nbytes for a in arrays.values())
    np.testing.assert_array_equal(values(store, "m64", (8, 32), "f32"), arrays["m64"].astype(np.float32))
    np.testing.assert_array_equal(values(store, "m16", (8, 32), "f16"), arrays["m16"])
    np.testing.assert_array_equal(values(store, "k", (4, 2, 3, 3), "f32"), arrays["k"].astype(np.float32))
    only = WeightFile.from_arrays(arrays, "net.pth", names=["v32"], dtypes={"v32": "f16"})
    assert list(only.infos) == ["v32"] and only.dtypes == {"v32": "f16"}
    from sdplan.core.errors import ModelFileError

    with pytest.raises(ModelFileError, match="net.pth.*'bad'.*uint8"):
        WeightFile.from_arrays({"bad": np.zeros(4, np.uint8)}, "net.pth")
    with pytest.raises(ModelFileError, match="missing tensors: nope"):
        WeightFile.from_arrays(arrays, "net.pth", names=["nope"])
    q = WeightFile.from_arrays(arrays, "net.pth", names=["m64"], dtypes={"m64": "q8_0"})
    qs = q.new_store()
    qs.allocate(["m64"], cpu)
    with pytest.raises(ModelFileError, match="q8_0 cannot be made from an array"):
        q.read(qs, ["m64"])


def test_float_matrices_for_the_bf16_kernel(cpu) -> None:
    """With sdplan's bf16 kernel f16 matrices and conv kernels become bf16 as they load (AMX) or
    stay f16 (AVX512_BF16: the kernel rounds them as it uses them), vectors f32; hold_for
    re-applies the policy, keeping given dtypes."""
    if G.bf16_cpu_kernel() == "off":
        pytest.skip("this CPU runs no bf16 kernel")
    arrays = {"m64": RNG.standard_normal((8, 32)), "m16": RNG.standard_normal((8, 32)).astype(np.float16),
              "v32": RNG.standard_normal(32).astype(np.float32), "k": RNG.standard_normal((4, 2, 3, 3))}
    arrays["k16"] = arrays["k"].astype(np.float16)
    before = G.bf16_kernel()
    G.set_bf16_kernel("auto")
    wf = WeightFile.from_arrays(arrays, "net.pth", backend=cpu, dtypes={"m64": "f32"})
    assert wf.dtypes == {"m64": "f32", "m16": "f16", "v32": "f32", "k": "f32", "k16": "f16"}  # not asked
    wf.hold_for(cpu, bf16=True)
    h16 = "bf16" if G.bf16_kernel() == "amx" else "f16"  # AMX converts as it loads (bf16_at_load)
    assert wf.dtypes == {"m64": "f32", "m16": h16, "v32": "f32", "k": "f32", "k16": h16}  # f32 stays
    G.set_bf16_kernel("off")
    try:
        wf.hold_for(cpu, bf16=True)
        assert wf.dtypes == {"m64": "f32", "m16": "f16", "v32": "f32", "k": "f32", "k16": "f16"}
    finally:
        G.set_bf16_kernel(before)
    store = wf.new_store()
    store.allocate(list(arrays), cpu)
    wf.read(store, list(arrays))
    np.testing.assert_array_equal(values(store, "m16", (8, 32), "f16"), arrays["m16"])


@pytest.mark.parametrize("n", [1, 31, 33, 4096 + 7])
def test_f16_weights_read_into_bf16_round_to_nearest_even(cpu, tmp_path, n) -> None:
    """f16 -> bf16 at load (vectorized where the CPU runs the bf16 kernel, ggml's rows
    otherwise) equals rounding the exact f32 value to nearest even; lengths hit the 32-value
    steps and their tails."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(n)
    a = (rng.standard_normal((2, n)) * 10).astype(np.float16)
    special = np.array([0.0, -0.0, 65504.0, 6e-8], np.float16)  # signed zero, largest, subnormal
    a.reshape(-1)[:4] = special[:a.size]
    path = tmp_path / "h.safetensors"
    save_file({"w": a}, str(path))
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    want = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)).tobytes()
    before = G.bf16_kernel()
    for kernel in ("auto", "off"):
        G.set_bf16_kernel(kernel)
        try:
            wf = WeightFile(path, dtypes={"w": "bf16"})
            store = wf.new_store()
            store.allocate(["w"], cpu)
            wf.read(store, ["w"])
            assert store.get_bytes("w") == want, kernel
        finally:
            G.set_bf16_kernel(before)


def test_mapping_is_turned_off_by_the_usual_spellings(monkeypatch) -> None:
    from sdplan.core.runtime.weights import MMAP_ENV, mmap_enabled

    for value, on in (("", True), ("1", True), ("yes", True), ("0", False), ("false", False),
                      (" OFF ", False), ("No", False)):
        monkeypatch.setenv(MMAP_ENV, value)
        assert mmap_enabled() is on, value
    monkeypatch.delenv(MMAP_ENV)
    assert mmap_enabled()


def test_a_file_changed_after_its_header_was_read_is_refused(cpu, sample, tmp_path) -> None:
    """A module that loads later in a run (the VAE after sampling) must not mix in another
    file's weights: replacing or rewriting the file after its header was read is an error
    naming it, for reads and mappings alike; an unchanged file loads."""
    import os

    from sdplan.core.errors import ModelFileError

    path, _ = sample
    copy = tmp_path / "copy.safetensors"
    copy.write_bytes(path.read_bytes())
    wf = WeightFile(copy)
    store = wf.new_store()
    bufs = [store.allocate(["a"], cpu)]
    assert wf.read(store, ["a"]) > 0
    other = tmp_path / "other.safetensors"
    other.write_bytes(path.read_bytes())
    other.replace(copy)  # same bytes, another file
    with pytest.raises(ModelFileError, match=r"copy\.safetensors: the file changed since sdplan opened it"):
        wf.map(store, ["b"], cpu)
    wf = WeightFile(copy)  # opened again: loads
    store = wf.new_store()
    bufs.append(store.allocate(["a"], cpu))
    wf.read(store, ["a"])
    st = copy.stat()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # rewritten in place
    with pytest.raises(ModelFileError, match="changed since"):
        wf.read(store, ["a"])
    for b in bufs:
        b.free()


def rne_bf16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to bf16, nearest even (finite inputs), as uint16 bits."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


@pytest.mark.skipif(G.bf16_cpu_kernel() == "off", reason="this CPU runs no bf16 kernel")
@pytest.mark.parametrize("shape,chunk", [
    ((37, 45), 4096),   # rows of 90 bytes: spans start off every 64-byte boundary
    ((3, 7), 4096),     # shorter than one 32-value block
    ((3, 2085), 4096),  # one row per span (4170 bytes): unaligned starts, blocks, a masked tail
    ((64, 640), 1 << 20),  # whole 64-byte blocks, one span
    ((600, 1000), 1 << 22),  # one span filled in three pieces (512 KB each, the last short)
])
def test_f16_to_bf16_on_load_rounds_each_value_to_nearest_even(cpu, tmp_path, shape, chunk) -> None:
    """An f16 tensor held in bf16 (the CPU bf16 kernel's weights) is converted while it is read,
    on several threads, into the exact nearest-even bf16 of each value: spans of any length
    and alignment, and spans filled in pieces."""
    a = (RNG.standard_normal(shape) * 3).astype(np.float16)
    a.flat[:4] = [65504.0, -0.0, 6e-8, 1.0009765625]  # f16's largest, negative zero, a subnormal, 1 + 2^-10
    path = tmp_path / "f16.safetensors"
    write_safetensors(path, {"w": ("F16", a, a.shape)})
    wf = WeightFile(path, backend=cpu, dtypes={"w": "bf16"})
    store = wf.new_store()
    store.allocate(["w"], cpu)
    wf.read(store, ["w"], chunk_bytes=chunk, n_threads=2)
    got = np.frombuffer(store.get_bytes("w"), np.uint16).reshape(shape)
    np.testing.assert_array_equal(got, rne_bf16(a.astype(np.float32)).reshape(shape))
