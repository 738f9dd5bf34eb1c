"""The embedded server's model: a DeepSeek-class stand-in decoder with a real paged fp8 KV cache.

Per decode step, for the B running requests (DESIGN.md, "The embedded server's model")::

    x = embed[token]                                   [B, hidden]
    for each of num_layers layers:
        q, latent = split(rmsnorm(x) @ Wqkv) -> [B, H, d_qk] (bf16), [B, d_qk]
        latent is quantized in the workload's layout and written to the request's page (page table)
        index rows = top-k selector (below) over the request's tokens -> [B, topk] int32, -1 empty
        o, lse = sparse MLA decode(q, cache, index rows)   (the variant's Triton kernel on a GPU)
        x += o.reshape(B, H*d_v) @ Wo
        x += MLP(rmsnorm(x)): SwiGLU hidden_size -> mlp_size -> hidden_size
    logits = rmsnorm(x) @ Wlm;  next = argmax(logits + bigram prior)     (greedy)

Top-k selector (deterministic, graph-safe): a request with n cached tokens (the new one included)
attends to all of them when n <= topk; otherwise to its most recent topk/2 tokens plus topk/2
"landmark" tokens evenly spaced over the older context (position floor(i*(n-topk/2)/(topk/2))).
This stands in for DeepSeek's lightning indexer: the kernel sees full index rows from a scattered
set of pages, which is what its cost depends on.

Bigram prior: each token t has a fixed successor succ(t) (a seeded permutation of the vocabulary)
whose logit gets ``greedy_margin`` (default 8, logits have unit scale) added. It keeps greedy
decoding stable against batch-size-dependent rounding (the kernel's split count and the GEMM
algorithms change with B), so outputs at concurrency 1 and N must match exactly, and it makes
every prompt's output distinct (a permutation never merges two sequences), which lets verify spot a
stream that carries another request's tokens. Attention still runs in full and its time counts;
a NaN from a broken kernel still changes the output.

Tokenizer (documented, trivial, deterministic): whitespace words; a word's id is
``1 + crc32(word) % (vocab_size - 1)`` (0 is padding); an empty prompt is ``[1]``. A token's text is
a space plus a pseudo-word spelled from its id (consonant-vowel syllables, base 70), distinct per id.

Sizes: the workload's shape on a GPU (``workload.model``); on a CPU the workload's ``cpu`` block
overrides heads/topk/page_size and the model shrinks to ``workload.cpu.model`` (defaults: 2 layers,
hidden 256, mlp 512, vocab 4096), and attention runs the torch reference (the Triton interpreter is
far too slow to serve). Weights: N(0, 1/fan_in) from ``workload.model.seed``.

CUDA graphs: with ``server.cuda_graphs`` and a GPU, one graph per batch-size bucket
(``server.graph_batch_buckets``), captured at start after eager warm-up runs (so any autotuning
happens before capture); a step pads its batch to the smallest bucket >= B (pad rows write to a
reserved trash page 0). Eager otherwise. A step's inputs (tokens, positions, page tables) are written
with NumPy into one persistent host staging tensor (pinned on a GPU) and moved by one copy into the
device tensors the graphs read: the step's input path releases the GIL once (issue 12). A decode step
is :meth:`DecoderModel.launch` (load, replay or eager forward) then :meth:`DecoderModel.collect` (the
read-back), so a caller can do host work while the GPU runs; :meth:`DecoderModel.decode` is both in a row.

Attention share: eager steps time attention against the whole step (CPU: every step; GPU: CUDA
events in :meth:`DecoderModel.calibrate`, run at start for a few bucket sizes, since graph replays
cannot be split).
"""

from __future__ import annotations

import collections
import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from kernelcamp.errors import KernelcampError
from kernelcamp.serve.attention import CacheWriter, check_writer, load_backend

PREFILL_MIN_ROWS = 16  # a prefill forward's rows: a power of two, at least this many (DecoderModel.prefill_many)
CPU_MODEL_DEFAULTS = {"num_layers": 2, "hidden_size": 256, "mlp_size": 512, "vocab_size": 4096}


@dataclass
class ModelConfig:
    """Shapes of the stand-in model and its cache (see the module docstring for the CPU rules)."""

    layout: str
    num_heads: int
    topk: int
    page_size: int
    num_layers: int
    hidden_size: int
    mlp_size: int
    vocab_size: int
    seed: int
    num_cache_tokens: int
    max_context_tokens: int
    max_running_requests: int
    sm_scale: float | None = None
    greedy_margin: float = 8.0

    @classmethod
    def from_params(cls, params: dict[str, Any], device: str) -> ModelConfig:
        wl = params.get("workload") or {}
        server = params.get("server") or {}
        model = dict(wl.get("model") or {})
        on_cpu = not str(device).startswith("cuda")
        shape = dict(wl)
        if on_cpu:
            cpu = wl.get("cpu") or {}
            shape.update({k: cpu[k] for k in ("num_heads", "topk", "page_size", "num_cache_tokens") if k in cpu})
            model.update(CPU_MODEL_DEFAULTS)
            model.update(cpu.get("model") or {})
        cache_tokens = int(server.get("num_cache_tokens") or shape.get("num_cache_tokens", 262144))
        if on_cpu:
            cache_tokens = max(cache_tokens, int(server.get("cpu_cache_tokens", 16384)))
        return cls(
            layout=wl.get("layout", "deepseek_v4"),
            num_heads=int(shape.get("num_heads", 64)),
            topk=int(shape.get("topk", 512)),
            page_size=int(shape.get("page_size", 64)),
            num_layers=int(model.get("num_layers", 4)),
            hidden_size=int(model.get("hidden_size", 2048)),
            mlp_size=int(model.get("mlp_size", 4096)),
            vocab_size=int(model.get("vocab_size", 32000)),
            seed=int(model.get("seed", 0)),
            num_cache_tokens=cache_tokens,
            max_context_tokens=int(server.get("max_context_tokens", 2048)),
            max_running_requests=int(server.get("max_running_requests", 96)),
            sm_scale=wl.get("sm_scale"),
            greedy_margin=float(model.get("greedy_margin", 8.0)),
        )


def attention_impl(on_gpu: bool, backend: Any) -> str:
    """Which attention a server runs: ``"triton"`` (the variant's kernel, on a GPU) or
    ``"torch_reference_cpu"`` (no GPU: the interpreter would be far too slow for serving).

    Raises ``KernelcampError`` on a GPU whose configured kernel module failed to load
    (:func:`kernelcamp.serve.attention.load_backend`): serving the torch reference there, under the
    variant's hash, would have a benchmark compare the reference against itself and call it a result.
    """
    if not on_gpu:
        return "torch_reference_cpu"
    if backend.SparseMLADecode is None:
        raise KernelcampError(
            f"kernel module {backend.module!r} did not load ({backend.error}): the server will not serve "
            "the torch reference in its place; fix the kernel file and deploy again"
        )
    return "triton"


class DecoderModel:
    """The stand-in decoder: weights, paged caches, page pool, prefill and (graph) decode steps.

    Not thread-safe: one scheduler drives it. ``variant`` is a ``kernelcamp.variant.Variant`` (the
    Triton launcher's configs); ``kernel`` is params.yaml's ``kernel`` section.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        variant: Any,
        kernel: dict[str, Any] | None,
        device: str = "cpu",
        cuda_graphs: bool = False,
        graph_batch_buckets: list[int] | None = None,
    ):
        self.cfg, self.variant, self.device = cfg, variant, torch.device(device)
        self.on_gpu = self.device.type == "cuda"
        self.backend = load_backend(kernel)
        if cfg.layout not in self.backend.LAYOUTS:
            raise KernelcampError(f"workload.layout {cfg.layout!r} is not one of {sorted(self.backend.LAYOUTS)}")
        self.layout = self.backend.LAYOUTS[cfg.layout]
        self.d_qk, self.d_v = self.layout.d_qk, self.layout.d_v
        self.sm_scale = cfg.sm_scale if cfg.sm_scale is not None else 1.0 / math.sqrt(self.d_qk)
        self.dtype = torch.bfloat16 if self.on_gpu else torch.float32
        self.launcher = None
        self.attention_impl = attention_impl(self.on_gpu, self.backend)
        if self.attention_impl == "triton":
            self.launcher = self.backend.SparseMLADecode(
                variant, dot_dtype=(kernel or {}).get("dot_dtype", "bf16"), check_indices=False
            )
        self.writer = CacheWriter(self.backend.quantize_kv_cache, self.layout, cfg.page_size)
        check_writer(self.writer, self.device)
        self._init_weights()
        p = cfg.page_size
        self.num_pages = max(2, cfg.num_cache_tokens // p)
        self.caches = [
            torch.zeros(self.num_pages, p * self.layout.token_bytes, dtype=torch.uint8, device=self.device)
            for _ in range(cfg.num_layers)
        ]
        self.free_pages = collections.deque(range(1, self.num_pages))  # page 0: trash page for pad rows
        self.max_pages = math.ceil(cfg.max_context_tokens / p)
        # rows of one prefill forward at most: the power of two that holds one longest prompt
        self.prefill_max_rows = max(PREFILL_MIN_ROWS, 1 << (cfg.max_context_tokens - 1).bit_length())
        if self.num_pages - 1 < self.max_pages:  # a request the context allows could never be admitted
            raise KernelcampError(
                f"the page pool of {cfg.num_cache_tokens} tokens (server.num_cache_tokens; on a CPU at least "
                f"server.cpu_cache_tokens) has {self.num_pages - 1} usable pages of {p} tokens, fewer than the "
                f"{self.max_pages} one request of server.max_context_tokens={cfg.max_context_tokens} needs: "
                f"raise num_cache_tokens to at least {(self.max_pages + 1) * p} or lower max_context_tokens"
            )
        bmax = max([cfg.max_running_requests] + list(graph_batch_buckets or []))
        self.buckets = sorted({int(b) for b in (graph_batch_buckets or []) if 0 < int(b) <= bmax} | {bmax})
        # The step's inputs, packed in one int64 tensor per side: row i = [token, position, page table
        # (max_pages)] of request i. The host side is pinned on a GPU and filled through a NumPy view with
        # NumPy slice assignments only (they hold the GIL); one copy_ moves rows [:nb] to the device (see
        # _load). tok [bmax], pos [bmax] and ptab [bmax, max_pages] are views of the device side: the CUDA
        # graphs are captured reading them, so they keep this storage for the model's lifetime (never rebind).
        self._stage = torch.zeros(bmax, 2 + self.max_pages, dtype=torch.long, pin_memory=self.on_gpu)
        self._stage_np = self._stage.numpy()
        self._stage_dev = torch.zeros(bmax, 2 + self.max_pages, dtype=torch.long, device=self.device)
        self.tok = self._stage_dev[:, 0]
        self.pos = self._stage_dev[:, 1]
        self.ptab = self._stage_dev[:, 2:]
        # (host rows [:nb], device rows [:nb]) per nb, made once: a step's load is then one torch call
        self._stage_views = [(self._stage[:n], self._stage_dev[:n]) for n in range(bmax + 1)]
        # the page list each host row holds now ([] = all zeros), so a step rewrites only rows that changed
        self._stage_rows: list[list[int]] = [[] for _ in range(bmax)]
        # True from a non_blocking copy out of the pinned rows until a host sync shows it has finished
        self._staging_pending = False
        self.next_tok = torch.zeros(bmax, dtype=torch.long, device=self.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.cuda_graphs = bool(cuda_graphs and self.on_gpu)
        self.graphs_disabled_reason = None if self.cuda_graphs else ("no GPU" if not self.on_gpu else "flag off")
        self.attn_ms_last = 0.0
        # what the last decode step ran (see :meth:`collect`): its padded batch and where its time went
        self.last_bucket: int | None = None
        self.last_timing: dict[str, float | None] = {}
        # the step launch() started and collect() has not read yet: (B, bucket, three perf_counter times)
        self._launched: tuple[int, int, float, float, float] | None = None
        # two timing events around each decode step's replay or forward, created once (a few us per step)
        self._step_events = (
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if self.on_gpu else None
        )
        self.calibration: dict[int, dict[str, float]] = {}
        self.prefill_keys_tuned: list[int] = []  # prefill row counts the autotuner saw at warm-up

    # ---- weights -------------------------------------------------------------------------------
    def _init_weights(self) -> None:
        c, dev = self.cfg, self.device
        g = torch.Generator(device=dev).manual_seed(c.seed)

        def w(*shape: int, fan_in: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=g, device=dev) / math.sqrt(fan_in)).to(self.dtype)

        h, H = c.hidden_size, c.num_heads
        self.embed = torch.randn(c.vocab_size, h, generator=g, device=dev).to(self.dtype)
        # q and the new token's latent come from one GEMM (wqkv: [h, H*d_qk + d_qk]); the SwiGLU gate
        # and up projections from one (w13: [h, 2*mlp]): fewer launches per step, same math.
        self.layers = [
            dict(
                wqkv=w(h, H * self.d_qk + self.d_qk, fan_in=h),
                wo=w(H * self.d_v, h, fan_in=H * self.d_v),
                w13=w(h, 2 * c.mlp_size, fan_in=h),
                w2=w(c.mlp_size, h, fan_in=c.mlp_size),
            )
            for _ in range(c.num_layers)
        ]
        self.lm = w(h, c.vocab_size, fan_in=h)
        self.succ = torch.randperm(c.vocab_size, generator=g, device=dev)

    @staticmethod
    def _rms(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), eps=1e-6)

    # ---- selector and attention ------------------------------------------------------------------
    def select(self, pos: torch.Tensor, ptab: torch.Tensor) -> torch.Tensor:
        """Index rows [N, topk] int32 (flat token ids, -1 empty) for queries at positions ``pos``."""
        k, p = self.cfg.topk, self.cfg.page_size
        n = pos + 1
        j = torch.arange(k, device=pos.device)
        recent = k // 2
        land = k - recent
        older = (n - recent).clamp_min(0)[:, None]
        lpos = (j[None, :land] * older) // land
        rpos = n[:, None] - recent + (j[None, land:] - land)
        sel = torch.cat([lpos, rpos], 1)
        sel = torch.where(n[:, None] <= k, j[None, :].expand(n.shape[0], k), sel)
        valid = sel < n[:, None]
        sel = sel.clamp(0, self.cfg.max_context_tokens - 1)
        page = torch.gather(ptab, 1, sel // p)
        flat = page * p + sel % p
        return torch.where(valid, flat, torch.full_like(flat, -1)).to(torch.int32)

    def _attention(self, q: torch.Tensor, cache: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        if self.launcher is not None:
            out, _ = self.launcher(q, cache, idx, self.cfg.layout, self.cfg.page_size, self.sm_scale)
        else:
            out, _ = self.backend.ref(
                q, cache, idx, self.cfg.layout, self.cfg.page_size, self.sm_scale, check_indices=False
            )
        return out

    # ---- forward -------------------------------------------------------------------------------
    def _forward(self, tok: torch.Tensor, pos: torch.Tensor, ptab: torch.Tensor, timer: Any = None) -> torch.Tensor:
        """Run all layers for N query tokens (their latents are written first, then attention).

        tok/pos [N] int64, ptab [N, max_pages] int64 -> next tokens [N] int64. ``timer``: None or
        a callable ``timer(tag)`` marking attention start/end (for the attention share).
        """
        c, p = self.cfg, self.cfg.page_size
        n_rows = tok.shape[0]
        slots = torch.gather(ptab, 1, (pos // p)[:, None])[:, 0] * p + pos % p
        idx = self.select(pos, ptab)
        x = self.embed[tok]
        for li, L in enumerate(self.layers):
            qkv = self._rms(x) @ L["wqkv"]
            q = qkv[:, : c.num_heads * self.d_qk].reshape(n_rows, c.num_heads, self.d_qk).to(torch.bfloat16)
            self.writer.write(self.caches[li], qkv[:, c.num_heads * self.d_qk :].to(torch.bfloat16), slots)
            if timer:
                timer("attn_start")
            o = self._attention(q, self.caches[li], idx)
            if timer:
                timer("attn_end")
            x = x + o.reshape(n_rows, c.num_heads * self.d_v).to(self.dtype) @ L["wo"]
            gate, up = (self._rms(x) @ L["w13"]).chunk(2, dim=-1)
            x = x + (torch.nn.functional.silu(gate) * up) @ L["w2"]
        logits = (self._rms(x) @ self.lm).float()
        rows = torch.arange(n_rows, device=tok.device)
        logits[rows, self.succ[tok]] += c.greedy_margin
        return logits.argmax(-1)

    # ---- pages ---------------------------------------------------------------------------------
    def pages_needed(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.cfg.page_size)

    def alloc(self, num_tokens: int) -> list[int] | None:
        """Pages for ``num_tokens`` tokens, or None when the pool is short (the request waits)."""
        need = self.pages_needed(num_tokens)
        if need > self.max_pages:
            raise KernelcampError(f"{num_tokens} tokens exceed server.max_context_tokens={self.cfg.max_context_tokens}")
        if need > len(self.free_pages):
            return None
        return [self.free_pages.popleft() for _ in range(need)]

    def free(self, pages: list[int]) -> None:
        self.free_pages.extend(pages)

    def _ptab_row(self, pages: list[int]) -> list[int]:
        return list(pages) + [0] * (self.max_pages - len(pages))

    # ---- public steps --------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, prompt: list[int], pages: list[int]) -> int:
        """Write the prompt's latents (causal attention over its own top-k) and return the first token
        (:meth:`prefill_many` of one prompt: padded rows, as every prefill)."""
        return self.prefill_many([prompt], [pages])[0]

    @torch.inference_mode()
    def prefill_many(self, prompts: list[list[int]], pages: list[list[int]]) -> list[int]:
        """:meth:`prefill` for K prompts: their tokens are concatenated as rows, each row with its own
        position and page-table row, so each prompt attends over its own pages only, as alone. Returns
        the K first tokens (in order). Raises ``ValueError`` for mismatched lengths.

        Rows per forward: the prompts are taken in order into forwards of at most
        :attr:`prefill_max_rows` rows (a prompt is never split; one is at most
        ``max_context_tokens`` long, which fits), each padded to a power of two of at least
        :data:`PREFILL_MIN_ROWS` with the decode step's pad rows (token 0, position 0, every page the
        trash page 0). The attention kernel's autotune key is its row count, and a variant that is an
        autotune list re-tunes at every new key (Triton's autotuner times every config of the list, on
        the model thread, while every stream waits); padded and capped, the keys are the few of
        :attr:`prefill_row_buckets`, all tuned by :meth:`warmup` before the server takes a request."""
        if len(prompts) != len(pages):
            raise ValueError(f"prefill_many: {len(prompts)} prompts but {len(pages)} page lists")
        out: list[int] = []
        i = 0
        while i < len(prompts):
            j, rows = i, 0
            while j < len(prompts) and (j == i or rows + len(prompts[j]) <= self.prefill_max_rows):
                rows += len(prompts[j])
                j += 1
            out += self._prefill_group(prompts[i:j], pages[i:j])
            i = j
        return out

    def _prefill_group(self, prompts: list[list[int]], pages: list[list[int]], pad: bool = True) -> list[int]:
        """One forward over the prompts' rows (padded as :meth:`prefill_many` says unless ``pad`` is
        False); their first tokens."""
        toks: list[int] = []
        pos: list[int] = []
        rows: list[list[int]] = []
        last: list[int] = []
        for prompt, pg in zip(prompts, pages, strict=True):
            toks += prompt
            pos += range(len(prompt))
            rows += [self._ptab_row(pg)] * len(prompt)
            last.append(len(toks) - 1)
        n_pad = (max(PREFILL_MIN_ROWS, 1 << (len(toks) - 1).bit_length()) - len(toks)) if pad else 0
        toks += [0] * n_pad
        pos += [0] * n_pad
        rows += [[0] * self.max_pages] * n_pad
        dev = self.device
        out = self._forward(
            torch.tensor(toks, dtype=torch.long, device=dev),
            torch.tensor(pos, dtype=torch.long, device=dev),
            torch.tensor(rows, dtype=torch.long, device=dev),
        )
        return out[torch.tensor(last, device=dev)].tolist()

    @property
    def prefill_row_buckets(self) -> list[int]:
        """The row counts a prefill forward can have: powers of two from :data:`PREFILL_MIN_ROWS` to
        :attr:`prefill_max_rows`."""
        return [1 << k for k in range(PREFILL_MIN_ROWS.bit_length() - 1, self.prefill_max_rows.bit_length())]

    def bucket_for(self, b: int) -> int:
        for s in self.buckets:
            if s >= b:
                return s
        raise KernelcampError(f"batch {b} exceeds the largest bucket {self.buckets[-1]}")

    def _load(self, tokens: list[int], positions: list[int], pages: list[list[int]], nb: int) -> None:
        """Put a step's inputs in ``tok``/``pos``/``ptab`` rows [:nb] (device): B = len(tokens) requests'
        last tokens, positions and page lists (ints, at most ``max_pages`` each), then nb - B pad rows
        (token 0, position 0, every page the trash page 0). Row j >= len(pages[i]) of ``ptab`` is 0.

        Host work is NumPy only on the staging rows (no GIL release), and a row whose page list equals
        the one it holds is not rewritten; then one ``copy_`` to the device (non_blocking from pinned
        memory on a GPU): the step's only torch call, so its only GIL release.

        Reusing the pinned rows is safe because each non_blocking copy is followed by a host sync before
        the next fill: ``collect`` (so ``decode`` too) does ``.tolist()``, which waits for the stream the
        copy was queued on (copy, then forward, then the read-back), ``_capture`` and ``calibrate`` synchronize the
        device, and all of them clear ``_staging_pending``. A path that does not (``warmup``'s eager
        step, a benchmark calling ``_load`` itself) leaves it set, and the next ``_load`` synchronizes
        first. ``prefill`` does not use these rows.

        Raises ``KernelcampError`` when the lengths differ or not B <= nb <= the largest bucket, and
        ``ValueError`` (NumPy) for a page list longer than ``max_pages``.
        """
        b = len(tokens)
        if len(positions) != b or len(pages) != b or not b <= nb < len(self._stage_views):
            raise KernelcampError(
                f"decode inputs: {b} tokens, {len(positions)} positions, {len(pages)} page lists, "
                f"bucket {nb} (at most {len(self._stage_views) - 1})"
            )
        if self._staging_pending:  # a copy not yet known to be done may still read the pinned rows
            torch.cuda.synchronize(self.device)
            self._staging_pending = False
        a, held = self._stage_np, self._stage_rows
        a[:b, 0] = tokens
        a[:b, 1] = positions
        a[b:nb, :2] = 0
        for i in range(nb):
            p = pages[i] if i < b else []
            old = held[i]
            if isinstance(p, list) and p == old:
                continue
            n, m = len(p), len(old)
            if n:
                a[i, 2 : 2 + n] = p
            if m > n:
                a[i, 2 + n : 2 + m] = 0
            held[i] = list(p)
        src, dst = self._stage_views[nb]
        dst.copy_(src, non_blocking=self.on_gpu)
        self._staging_pending = self.on_gpu

    @torch.inference_mode()
    def decode(self, tokens: list[int], positions: list[int], pages: list[list[int]]) -> list[int]:
        """One decode step for B requests: :meth:`launch` then :meth:`collect` in a row.

        ``tokens``: their last tokens, ``positions``: tokens already cached, ``pages``: page lists ->
        their next tokens (B ints). Sets ``last_bucket`` and ``last_timing`` as :meth:`collect` says
        (``handoff_ms`` is about 0 here). Raises ``KernelcampError`` as :meth:`launch` does."""
        self.launch(tokens, positions, pages)
        return self.collect()

    @torch.inference_mode()
    def launch(self, tokens: list[int], positions: list[int], pages: list[list[int]]) -> None:
        """Start one decode step for B requests (their last tokens, positions = tokens already cached,
        and page lists); :meth:`collect` returns its next tokens. Pads to a graph bucket when graphs are on.

        Host side: :meth:`_load` (the step's one input copy), then the bucket's graph replay or the
        eager forward, between two timing events on a GPU. On a GPU this returns once the work is
        queued, so the caller's host work until :meth:`collect` overlaps the GPU's; on a CPU the
        forward runs here, synchronously. Between launch and collect the caller must not touch the
        model (no prefill, no other launch): the step writes the cache pages of its requests and
        ``next_tok``.

        Raises ``KernelcampError`` when a launched step has not been collected yet, for bad input
        lengths or a batch over the largest bucket (see :meth:`_load`)."""
        if self._launched is not None:
            raise KernelcampError("launch: the previous decode step was launched and not collected")
        b = len(tokens)
        nb = self.bucket_for(b) if self.cuda_graphs else b
        if self.cuda_graphs and nb not in self.graphs:
            self._capture(nb)  # before _load: the capture loads (and runs) its own dummy inputs
        t_load = time.perf_counter()
        self._load(tokens, positions, pages, nb)
        ev = self._step_events
        t_launch = time.perf_counter()
        if ev is not None:
            ev[0].record()
        if self.cuda_graphs:
            self.graphs[nb].replay()
            self.attn_ms_last = float("nan")
        else:
            marks: dict[str, float] = {}
            timer = None
            if not self.on_gpu:
                acc = [0.0]

                def timer(tag: str) -> None:
                    now = time.perf_counter()
                    if tag == "attn_start":
                        marks["s"] = now
                    else:
                        acc[0] += now - marks["s"]

            self.next_tok[:nb] = self._forward(self.tok[:nb], self.pos[:nb], self.ptab[:nb], timer)
            self.attn_ms_last = acc[0] * 1e3 if timer else float("nan")
        if ev is not None:
            ev[1].record()
        self._launched = (b, nb, t_load, t_launch, time.perf_counter())

    @torch.inference_mode()
    def collect(self) -> list[int]:
        """The next tokens (B ints, in the order given to :meth:`launch`) of the launched decode step:
        ``.tolist()`` of its output, which waits for the GPU (the GIL is released while it waits).

        Sets what the step ran, for the server's step record: ``last_bucket`` (the padded batch the
        graph replayed; B when eager) and ``last_timing``, in ms (host times from ``time.perf_counter``):

        - ``load_ms``: host, filling the padded inputs' staging rows and issuing their one copy to the
          device (:meth:`_load`);
        - ``launch_ms``: host, from recording the first event to the launch's return (eager: the whole
          forward's launches); None on a CPU;
        - ``sync_ms``: host, from the launch's return to ``.tolist()``'s return (the caller's work between
          :meth:`launch` and :meth:`collect`, then waiting for the GPU, the output copy, and getting the
          GIL back: torch releases it while it waits);
        - ``handoff_ms``: host, the part of ``sync_ms`` from the launch's return to :meth:`collect` being
          called: the caller's work while the GPU ran (with ``server.overlap_scheduling``, handing the
          previous step's tokens to the event loop); through :meth:`decode` only the return from one
          call and the start of the other (about 0.06 ms on this project's 2-core CPU machine, where
          the eager forward's temporaries are freed in it);
        - ``gpu_ms``: GPU, between two CUDA events recorded on the stream around the replay or eager
          forward, read after the sync that ``.tolist()`` does anyway; it starts once the input copies
          are done. GPU idle waiting for the launch (the launch_ms after the first event, e.g. this
          thread waiting for the GIL) is inside it. None on a CPU.

        So ``sync_ms - (gpu_ms - launch_ms)`` is roughly the host's delay after the GPU finished.
        Raises ``KernelcampError`` when no step was launched (or it was collected already)."""
        if self._launched is None:
            raise KernelcampError("collect: no decode step was launched (or it was collected already)")
        (b, nb, t_load, t_launch, t_sync), self._launched = self._launched, None
        t_collect = time.perf_counter()
        out = self.next_tok[:b].tolist()  # copies to the host and so waits for the stream: both events are done
        self._staging_pending = False  # ... and so is the input copy queued before them (see _load)
        t_end = time.perf_counter()
        ev = self._step_events
        self.last_bucket = nb
        self.last_timing = {
            "gpu_ms": ev[0].elapsed_time(ev[1]) if ev is not None else None,
            "load_ms": (t_launch - t_load) * 1e3,
            "launch_ms": (t_sync - t_launch) * 1e3 if ev is not None else None,
            "sync_ms": (t_end - t_sync) * 1e3,
            "handoff_ms": (t_collect - t_sync) * 1e3,
        }
        return out

    def _capture(self, nb: int) -> None:
        """Eager warm-up (autotuning, compiles) on a side stream, then capture the bucket's graph."""
        self._load([0] * nb, [0] * nb, [[]] * nb, nb)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                self.next_tok[:nb] = self._forward(self.tok[:nb], self.pos[:nb], self.ptab[:nb])
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self.next_tok[:nb] = self._forward(self.tok[:nb], self.pos[:nb], self.ptab[:nb])
        torch.cuda.synchronize()
        self._staging_pending = False  # the dummy inputs' copy is done
        self.graphs[nb] = g

    @torch.inference_mode()
    def warmup(self) -> None:
        """Tune the prefill keys (an autotune-list variant: one eager forward of pad rows at each of
        :attr:`prefill_row_buckets`), then capture every bucket's graph (graphs on) or run one eager
        step (graphs off)."""
        if getattr(self.launcher, "autotunes", False):
            for n in self.prefill_row_buckets:
                z = torch.zeros(n, dtype=torch.long, device=self.device)
                self._forward(z, z, torch.zeros(n, self.max_pages, dtype=torch.long, device=self.device))
            self.prefill_keys_tuned = list(self.prefill_row_buckets)
        if self.cuda_graphs:
            try:
                for nb in self.buckets:
                    self._capture(nb)
            except Exception as e:  # noqa: BLE001 - serve eagerly, and say why
                self.graphs.clear()
                self.cuda_graphs = False
                self.graphs_disabled_reason = f"capture failed: {type(e).__name__}: {e}"[:300]
        else:
            self._load([0], [0], [[]], 1)
            self._forward(self.tok[:1], self.pos[:1], self.ptab[:1])

    @torch.inference_mode()
    def calibrate(self, batch_sizes: list[int] | None = None, reps: int = 3) -> dict[int, dict[str, float]]:
        """Eager steps on the trash page, attention timed against the whole step, per batch size."""
        sizes = batch_sizes or sorted({1, self.buckets[len(self.buckets) // 2], self.buckets[-1]})
        for b in sizes:
            self._load([0] * b, [0] * b, [[]] * b, b)
            attn_total = step_total = 0.0
            for _ in range(reps + 1):
                ev: list[Any] = []
                if self.on_gpu:

                    def timer(tag: str, ev=ev) -> None:
                        e = torch.cuda.Event(enable_timing=True)
                        e.record()
                        ev.append(e)

                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    self._forward(self.tok[:b], self.pos[:b], self.ptab[:b], timer)
                    end.record()
                    torch.cuda.synchronize()
                    self._staging_pending = False  # this batch's input copy is done
                    attn = sum(ev[i].elapsed_time(ev[i + 1]) for i in range(0, len(ev), 2))
                    step = start.elapsed_time(end)
                else:
                    marks: list[float] = []

                    def timer(tag: str, marks=marks) -> None:
                        marks.append(time.perf_counter())

                    t0 = time.perf_counter()
                    self._forward(self.tok[:b], self.pos[:b], self.ptab[:b], timer)
                    step = (time.perf_counter() - t0) * 1e3
                    attn = sum(marks[i + 1] - marks[i] for i in range(0, len(marks), 2)) * 1e3
                if _ > 0:  # the first run warms up
                    attn_total += attn
                    step_total += step
            self.calibration[b] = {
                "attn_ms": attn_total / reps,
                "step_ms": step_total / reps,
                "attention_share": attn_total / step_total if step_total else float("nan"),
            }
        return self.calibration

    def describe(self) -> dict[str, Any]:
        """Static facts for the info endpoint."""
        return {
            "config": asdict(self.cfg),
            "device": str(self.device),
            "attention_impl": self.attention_impl,
            "attention_source": self.backend.source,
            "attention_backend_error": self.backend.error,
            "cuda_graphs_active": self.cuda_graphs,
            "graphs_disabled_reason": self.graphs_disabled_reason,
            "graph_buckets": self.buckets if self.cuda_graphs else [],
            "prefill_row_buckets": self.prefill_row_buckets,
            "prefill_keys_tuned": self.prefill_keys_tuned,
            "num_pages": self.num_pages,
            "d_qk": self.d_qk,
            "d_v": self.d_v,
            "token_bytes": self.layout.token_bytes,
            "launcher_last_config": _jsonable(getattr(self.launcher, "last_config", None)),
        }


def _jsonable(obj: Any) -> Any:
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if hasattr(obj, "as_dict"):
        return obj.as_dict()
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "kwargs"):  # triton.Config
        return {
            **dict(obj.kwargs),
            "num_warps": getattr(obj, "num_warps", None),
            "num_stages": getattr(obj, "num_stages", None),
        }
    return str(obj)
