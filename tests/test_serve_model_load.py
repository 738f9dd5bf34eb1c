"""The decode step's input load (``DecoderModel._load``, issue 12): one host->device copy out of a persistent
staging buffer, no tensor built from Python lists, the same inputs (and so the same tokens) as before; the
device tensors the CUDA graphs read keep their storage."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from kernelcamp.errors import KernelcampError
from kernelcamp.io import load_params
from kernelcamp.serve.model import DecoderModel, ModelConfig
from kernelcamp.serve.tokens import encode
from kernelcamp.variant import parse_variant

ROOT = Path(__file__).resolve().parents[1]
BUCKETS = [1, 2, 4, 8]


def _model(device: str = "cpu") -> DecoderModel:
    p = load_params(ROOT / "params.yaml")
    p["server"] = {**p["server"], "max_running_requests": 8, "graph_batch_buckets": BUCKETS}
    if device != "cpu":
        p["workload"] = {**p["workload"], "model": {**p["workload"]["model"], "num_layers": 2}}
        p["server"]["num_cache_tokens"] = 65536
    cfg = ModelConfig.from_params(p, device)
    return DecoderModel(cfg, parse_variant(p["variant"]), p.get("kernel"), device, graph_batch_buckets=BUCKETS)


@pytest.fixture(scope="module")
def model():
    return _model()


class _Calls(TorchFunctionMode):
    """Every torch function or tensor method called (Python level), by name."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


class _Ops(TorchDispatchMode):
    """Every aten op run, with its tensor arguments' data pointers."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, list[int]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append((str(func), [a.data_ptr() for a in args if isinstance(a, torch.Tensor)]))
        return func(*args, **(kwargs or {}))


def _reference(model: DecoderModel, tokens, positions, pages, nb):
    """The inputs as the lists-to-tensors load built them: padded rows, pages then zeros."""
    pad = nb - len(tokens)
    rows = [list(p) + [0] * (model.max_pages - len(p)) for p in pages] + [[0] * model.max_pages] * pad
    return (
        torch.tensor(list(tokens) + [0] * pad, dtype=torch.long),
        torch.tensor(list(positions) + [0] * pad, dtype=torch.long),
        torch.tensor(rows, dtype=torch.long),
    )


def _storage(model: DecoderModel) -> list[int]:
    return [t.untyped_storage().data_ptr() for t in (model.tok, model.pos, model.ptab)]


def test_a_load_is_one_copy_from_the_staging_buffer_into_the_graph_inputs(model):
    model._load([5, 6, 7], [10, 70, 3], [[1], [2, 3], [4]], 4)  # rows hold pages: the next load changes them
    steps = [
        ([9, 8, 7], [11, 71, 4], [[1], [2, 3], [4]], 4),  # same pages: no row rewritten
        ([1, 2, 3, 4, 5], [64, 0, 130, 5, 6], [[7, 8], [9], [10, 11, 12], [13], [14]], 8),  # new rows + pad rows
        ([3], [2], [[15]], 1),  # fewer, shorter rows
    ]
    for tokens, positions, pages, nb in steps:
        with _Calls() as calls, _Ops() as ops:
            model._load(tokens, positions, pages, nb)
        # no torch.tensor() from lists, no slicing, no per-input copies: the one copy_ is the only torch call
        assert calls.names == ["copy_"], calls.names
        assert [name for name, _ in ops.ops] == ["aten.copy_.default"], ops.ops
        dst, src = ops.ops[0][1]
        assert src == model._stage.data_ptr() and dst == model.tok.data_ptr() == model._stage_dev.data_ptr()


def test_a_load_fills_the_inputs_the_lists_did_and_keeps_the_graph_inputs_storage(model):
    before = _storage(model)
    assert model.tok.data_ptr() != model.pos.data_ptr()  # views of one buffer, not one tensor
    steps = [
        ([4], [0], [[1]], 1),
        ([4, 5, 6], [63, 64, 200], [[1], [2, 3], [4, 5, 6, 7]], 4),  # one pad row
        ([5, 6, 7], [65, 201, 2], [[2, 3], [4, 5, 6, 7], [8]], 4),  # rows shifted (a request finished)
        ([7, 8], [3, 0], [[8], [9, 10]], 2),  # shorter lists in rows that held longer ones
        ([1] * 8, list(range(8)), [list(range(1 + i, 1 + i + model.max_pages - i)) for i in range(8)], 8),
        ([2], [1], [[3]], 8),  # a small batch padded to a bucket whose rows held long lists
        ([2, 3], [1, 2], [(3, 4), [5]], 2),  # a tuple is a page list too
        ([], [], [], 1),  # only a pad row
    ]
    for tokens, positions, pages, nb in steps:
        model._load(tokens, positions, pages, nb)
        tok, pos, ptab = _reference(model, tokens, positions, pages, nb)
        assert torch.equal(model.tok[:nb], tok) and torch.equal(model.pos[:nb], pos), (tokens, positions)
        assert torch.equal(model.ptab[:nb], ptab), pages
    assert _storage(model) == before
    assert not model._staging_pending  # a CPU copy is synchronous


def test_a_load_refuses_inputs_that_do_not_fit(model):
    with pytest.raises(KernelcampError, match="2 tokens, 1 positions"):
        model._load([1, 2], [0], [[1], [2]], 2)
    with pytest.raises(KernelcampError, match="bucket 1"):
        model._load([1, 2], [0, 1], [[1], [2]], 1)
    with pytest.raises(KernelcampError, match="bucket 9 .at most 8"):
        model._load([1], [0], [[1]], 9)
    with pytest.raises(ValueError):
        model._load([1], [0], [list(range(1, model.max_pages + 2))], 1)


def test_decode_tokens_equal_a_forward_on_tensors_built_from_lists(model):
    """Steps with a changing batch (requests join and finish, their page lists differ in length): each
    step's tokens are those of the forward on freshly built contiguous tensors (the step's latents are
    written again, to the same slots with the same values)."""
    reqs = []
    for i, text in enumerate(["a b c", "d", "e f g h i j k l", "m n"]):
        prompt = encode(text * (1 + 40 * (i % 2)), model.cfg.vocab_size)[: 60 + 20 * i]
        pages = model.alloc(len(prompt) + 16)
        assert pages is not None
        reqs.append({"pages": pages, "toks": [*prompt, model.prefill(prompt, pages)]})
    try:
        for step, live in enumerate([[0], [0, 1, 2], [0, 1, 2, 3], [1, 3], [2, 3], [0, 2, 3]]):
            batch = [reqs[i] for i in live]
            tokens = [r["toks"][-1] for r in batch]
            positions = [len(r["toks"]) - 1 for r in batch]
            pages = [r["pages"] for r in batch]
            out = model.decode(tokens, positions, pages)
            tok, pos, ptab = _reference(model, tokens, positions, pages, len(tokens))
            with torch.inference_mode():
                ref = model._forward(tok, pos, ptab).tolist()
            assert out == ref, (step, out, ref)
            for r, t in zip(batch, out, strict=True):
                r["toks"].append(t)
    finally:
        for r in reqs:
            model.free(r["pages"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_staging_buffer_is_pinned_and_the_copy_non_blocking_until_a_sync():
    m = _model("cuda:0")
    assert m._stage.is_pinned() and m._stage_dev.is_cuda and m.tok.is_cuda
    with _Calls() as calls:
        m._load([1, 2, 3], [0, 1, 2], [[1], [2], [3]], 4)
    assert calls.names == ["copy_"], calls.names
    assert m._staging_pending  # no host sync yet: the next load synchronizes before writing the rows
    m._load([4], [0], [[5]], 1)
    torch.cuda.synchronize()
    tok, pos, ptab = _reference(m, [4], [0], [[5]], 1)
    assert torch.equal(m.tok[:1].cpu(), tok) and torch.equal(m.ptab[:1].cpu(), ptab)
    m.decode([4, 5], [0, 0], [[5], [6]])
    assert not m._staging_pending  # .tolist() waited for the stream
