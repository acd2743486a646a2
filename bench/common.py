"""Shared plumbing for the benchmarks: the pair, the prompts, forward clocks, memory, tables.

Every benchmark measures ratios side by side in one process, methods interleaved prompt by
prompt with the same seeds, so that machine noise (other jobs on a shared box) hits all sides
alike. Absolute tokens/s on a shared 2-core machine mean little; the ratios are the result.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import platform
import resource
import sys
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mtad.engine.feature_head import is_head_folder
from mtad.engine.loading import LoadedPair, ModelSpec, load_pair
from mtad.engine.runner import ModelRunner
from mtad.engine.tiny import build_tiny_pair, build_tiny_tokenizer
from mtad.tokens import eos_token_ids

REPO = Path(__file__).resolve().parents[1]
MODEL_DRAFT = "assets/drafts/smollm2-draft"  # the independent draft model


def pair_default_draft() -> str:
    """The smollm2 pair's default draft on this host, by the pair config's own rule
    (``conf/pair/smollm2.yaml``: the feature head where the CPU has native bfloat16, the draft
    model elsewhere), so a benchmark's default is the harness's."""
    from omegaconf import OmegaConf

    from mtad.harness.config import register_configs

    register_configs()  # the config's resolvers
    return str(OmegaConf.load(REPO / "conf" / "pair" / "smollm2.yaml").draft.path)


DEFAULT_DRAFT = pair_default_draft()
STANDIN_DRAFT = REPO / ".dev" / "standin-draft-2l"  # ignored scratch folder, never committed
STANDIN_LAYERS = 2
PROMPT_FILE = REPO / "mtad" / "tasks" / "data" / "default_prompts.jsonl"

# Used only when the default prompt set is missing (a stripped checkout): chat, code, prose.
FALLBACK_PROMPTS = [
    {"id": "fb-chat-1", "kind": "chat", "prompt": "What are three ways to sleep better?"},
    {
        "id": "fb-code-1",
        "kind": "code",
        "prompt": "Write a Python function that reverses a linked list, with a docstring.",
    },
    {
        "id": "fb-prose-1",
        "kind": "prose",
        "prompt": "Write a short paragraph about autumn in a small harbour town.",
    },
    {"id": "fb-chat-2", "kind": "chat", "prompt": "How do I explain fractions to a child?"},
    {
        "id": "fb-code-2",
        "kind": "code",
        "prompt": "Write a SQL query that returns the ten "
        "customers with the highest total order value.",
    },
    {
        "id": "fb-prose-2",
        "kind": "prose",
        "prompt": "Describe a thunderstorm over the sea in four sentences.",
    },
]


# ------------------------------------------------------------------------------ arguments


def add_common_args(ap: argparse.ArgumentParser, *, prompts: int = 6, max_new: int = 64) -> None:
    g = ap.add_argument_group("pair and prompts")
    g.add_argument(
        "--pair",
        default="smollm2",
        choices=["smollm2", "tiny"],
        help="smollm2: SmolLM2-135M-Instruct + --draft; tiny: random test pair",
    )
    g.add_argument(
        "--draft",
        default=DEFAULT_DRAFT,
        help=f"draft folder, a model or a feature head (default: the pair's on this host, "
        f"{DEFAULT_DRAFT}); 'standin' or a missing default builds the stand-in (target's first "
        "2 layers) under .dev/",
    )
    g.add_argument(
        "--dtype",
        default="float32",
        choices=["bfloat16", "float32"],
        help="target dtype (float32, as conf/pair/smollm2.yaml: on AVX2 CPUs without native "
        "bf16, bf16 forwards of 4+ tokens are slower; see bench/forward_shapes.py)",
    )
    g.add_argument(
        "--head",
        default="auto",
        choices=["auto", "stock", "fast"],
        help="our runners' logits head (mtad.engine.heads.head_for); transformers' own "
        "generate always uses the stock head",
    )
    g.add_argument(
        "--linears",
        default="auto",
        choices=["auto", "stock"],
        help="our runners' projections on prepacked bfloat16 CPU weights (auto; "
        "mtad.engine.packed) or stock F.linear",
    )
    g.add_argument(
        "--draft-dtype",
        default=None,
        choices=["bfloat16", "float32"],
        help="draft dtype (default: --dtype)",
    )
    g.add_argument(
        "--prompt-file",
        default=None,
        help="jsonl with a 'prompt' field, or mtbench:mt_bench/question.jsonl for MT-Bench's 80 "
        f"questions (default {PROMPT_FILE.relative_to(REPO)})",
    )
    g.add_argument("--prompts", type=int, default=prompts, help="number of prompts")
    g.add_argument("--max-new", type=int, default=max_new, help="max new tokens per prompt")
    g.add_argument("--seed", type=int, default=0, help="seed of prompt i is seed + i")
    g.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1 on a shared 2-core box: oversubscription costs ~20x)",
    )


def setup(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except Exception:  # pragma: no cover - logging only
        pass


# ---------------------------------------------------------------------------------- pair


@dataclass
class BenchPair:
    pair: LoadedPair
    name: str
    draft_path: str | None
    standin: bool
    dtype: str
    draft_dtype: str
    notes: list[str] = field(default_factory=list)

    @property
    def target(self) -> ModelRunner:
        return self.pair.target

    @property
    def draft(self) -> ModelRunner | None:
        return self.pair.draft

    @property
    def tokenizer(self) -> Any:
        return self.pair.tokenizer

    def describe(self) -> str:
        if self.name == "tiny":
            return "tiny random llama pair (tests only)"
        draft = "stand-in draft (target's first 2 layers)" if self.standin else self.draft_path
        heads = f"our lm_head: target {self.target.lm_head}" + (
            f", draft {self.draft.lm_head}" if self.draft is not None else ""
        )
        return (
            f"smollm2: SmolLM2-135M-Instruct [{self.dtype}] + {draft} [{self.draft_dtype}]; "
            + heads
        )


def build_standin_draft(out: Path = STANDIN_DRAFT, layers: int = STANDIN_LAYERS) -> Path:
    """The target's first ``layers`` decoder layers plus its embeddings, final norm and head.

    A stopgap until the distilled draft ships: it shares the tokenizer and is built offline
    from the cached target (float32 weights; the loader casts).
    """
    if (out / "config.json").is_file():
        return out
    from transformers import LlamaConfig, LlamaForCausalLM

    from mtad.engine.smollm2 import load_smollm2_target

    target, _ = load_smollm2_target(dtype="float32")
    cfg = LlamaConfig.from_dict(target.config.to_dict())
    cfg.num_hidden_layers = layers
    draft = LlamaForCausalLM(cfg)
    draft.load_state_dict(target.state_dict(), strict=False)  # deeper layers are dropped
    draft.tie_weights()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    draft.save_pretrained(tmp)
    os.replace(tmp, out)
    return out


def resolve_draft(draft: str) -> tuple[Path, bool]:
    """``(folder, is_standin)`` for the ``--draft`` flag."""
    if draft == "standin":
        return build_standin_draft(), True
    path = Path(draft).expanduser()
    path = path if path.is_absolute() else REPO / path
    if (path / "config.json").is_file() or is_head_folder(path):
        return path, False
    if draft == DEFAULT_DRAFT:
        print(
            f"[bench] {DEFAULT_DRAFT} not found: using the stand-in draft "
            f"(target's first {STANDIN_LAYERS} layers) under {STANDIN_DRAFT}",
            file=sys.stderr,
        )
        return build_standin_draft(), True
    raise FileNotFoundError(f"--draft: no model folder at {path}")


def load_bench_pair(args: argparse.Namespace, need_draft: bool = True) -> BenchPair:
    draft_dtype = args.draft_dtype or args.dtype
    if args.pair == "tiny":
        target, draft = build_tiny_pair("llama")
        dt = getattr(torch, args.dtype)
        pair = LoadedPair(
            ModelRunner(target.to(dt), "target", args.head, linears=args.linears),
            ModelRunner(
                draft.to(getattr(torch, draft_dtype)), "draft", args.head, linears=args.linears
            ),
            build_tiny_tokenizer(),
        )
        return BenchPair(pair, "tiny", None, False, args.dtype, draft_dtype)
    draft_path, standin = resolve_draft(args.draft) if need_draft else (None, False)
    pair = load_pair(
        ModelSpec(loader="smollm2_gguf", dtype=args.dtype),
        ModelSpec(
            loader="local",
            path=str(draft_path),
            dtype=draft_dtype,
            kind="head" if is_head_folder(draft_path) else "model",
        )
        if need_draft
        else None,
        lm_head=args.head,
        linears=args.linears,
    )
    return BenchPair(
        pair, "smollm2", str(draft_path) if draft_path else None, standin, args.dtype, draft_dtype
    )


def eos_ids(pair: BenchPair) -> list[int]:
    return eos_token_ids(pair.tokenizer, pair.target.model)


# ------------------------------------------------------------------------------- prompts


@dataclass
class Prompt:
    id: str
    kind: str
    text: str
    ids: list[int]


def load_prompts(args: argparse.Namespace, tokenizer: Any) -> list[Prompt]:
    """The first ``--prompts`` prompts of the prompt file, wrapped in the chat template.

    The file is read as the harness's prompts task reads ``task.files``
    (:class:`mtad.tasks.prompts.PromptsTask`: each row checked, ``mtbench:<path>`` for MT-Bench's
    80 questions). With ``--prompts`` above the file's size the set cycles (repeats are fine for
    timing; the intervals count a repeated prompt once).
    """
    from mtad.tasks.prompts import PromptsTask, resolve_prompt_file

    path = str(args.prompt_file or PROMPT_FILE)
    if resolve_prompt_file(path).is_file():
        rows = [
            {"id": s.id, "kind": s.reference["kind"], "prompt": s.turns[0], "system": s.system}
            for s in PromptsTask(files=[path]).load_samples()
        ]
    elif args.prompt_file:
        raise FileNotFoundError(f"--prompt-file: {path} does not exist")
    else:
        print(
            f"[bench] {path} not found: using {len(FALLBACK_PROMPTS)} built-in prompts",
            file=sys.stderr,
        )
        rows = FALLBACK_PROMPTS
    out = []
    for i in range(args.prompts):
        row = rows[i % len(rows)]
        text = row["prompt"]
        out.append(
            Prompt(
                str(row.get("id", i)),
                str(row.get("kind", "prose")),
                text,
                encode_chat(tokenizer, text, row.get("system")),
            )
        )
    return out


def encode_chat(tokenizer: Any, text: str, system: str | None = None) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": text}
        ]
        rendered = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    return list(tokenizer(text)["input_ids"])


def truncate_at_eos(tokens: Sequence[int], eos: Iterable[int]) -> list[int]:
    """Tokens up to and including the first EOS (all of them when there is none)."""
    eos = set(eos)
    out = []
    for t in tokens:
        out.append(int(t))
        if t in eos:
            break
    return out


# -------------------------------------------------------------------------------- clocks


class ForwardClock:
    """Wall time spent inside the ``forward`` calls of some modules.

    Each module's ``forward`` is wrapped on the instance (no hooks: hooks would move
    ``nn.Module.__call__`` onto its slow path and inflate the overhead being measured). Every
    call is seen, whoever makes it (our runner, transformers' assisted generation), so "engine
    overhead" = wall time minus time inside model forwards is measured one way for every
    implementation. Nested calls are counted once (outermost only).
    """

    def __init__(self, modules: dict[str, torch.nn.Module | Sequence[torch.nn.Module]]) -> None:
        self.seconds = dict.fromkeys(modules, 0.0)
        self.cpu_seconds = dict.fromkeys(modules, 0.0)  # process CPU time, same calls
        self.calls = dict.fromkeys(modules, 0)
        self._depth = 0
        self._sync = torch.cuda.is_available() and torch.cuda.is_initialized()
        self._patched: list[torch.nn.Module] = []
        for name, group in modules.items():
            for module in [group] if isinstance(group, torch.nn.Module) else group:
                if any(module is m for m in self._patched):
                    continue
                module.forward = self._wrap(name, module.forward)
                self._patched.append(module)

    def _wrap(self, name: str, forward):
        @functools.wraps(forward)  # keeps inspect.signature (transformers reads it)
        def timed_forward(*args, **kwargs):
            self._depth += 1
            start, cpu = time.perf_counter(), time.process_time()
            try:
                return forward(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    if self._sync:
                        torch.cuda.synchronize()
                    self.seconds[name] += time.perf_counter() - start
                    self.cpu_seconds[name] += time.process_time() - cpu
                    self.calls[name] += 1

        return timed_forward

    def reset(self) -> None:
        for k in self.seconds:
            self.seconds[k] = 0.0
            self.cpu_seconds[k] = 0.0
            self.calls[k] = 0

    def snapshot(self) -> dict[str, float]:
        return dict(self.seconds)

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def remove(self) -> None:
        for module in self._patched:
            module.__dict__.pop("forward", None)
        self._patched = []


def time_head_step(runner: Any, rows: int, gen: torch.Generator) -> tuple[float, float]:
    """``(cpu ms, wall ms)`` of one drafted position of a feature-level head
    (:class:`mtad.engine.head_runner.HeadRunner`) on its ``rows`` rows, each reading its own
    previous output (compact rows, as drafting reads them); the cache and every row's state are
    put back, so the next call times the same step."""
    ids = torch.randint(0, runner.vocab_size, (rows, 1), generator=gen)
    with one_position_undone(runner):
        c0, w0 = time.process_time(), time.perf_counter()
        runner.forward(ids, compact=True)
        c, w = time.process_time() - c0, time.perf_counter() - w0
    return 1e3 * c, 1e3 * w


@contextlib.contextmanager
def one_position_undone(runner: Any) -> Iterator[None]:
    """Let a feature-level head's runner draft one position, then put its cache and every
    row's state back as they were."""
    last, true_len = runner.last, runner.true_len
    yield
    runner.cache.crop(-1)
    runner.cached_ids = runner.cached_ids[:, :-1]
    runner.last, runner.true_len = last, true_len


def head_after_context(pair: LoadedPair, context: torch.Tensor, rows: int) -> Any:
    """The pair's head runner after the target and the head read ``context`` (1-D), with
    ``rows`` identical rows: where a drafted step starts."""
    pair.target.reset()
    pair.draft.reset()
    pair.target.feed(context)
    pair.draft.feed(context, compact=True)
    pair.draft.repeat_rows(rows)
    return pair.draft


def pair_clock(pair: BenchPair) -> ForwardClock:
    """Clock the models (whoever calls them) and what our runners call for logits
    (``ModelRunner.net``: the model, or :class:`mtad.engine.heads.CPUHeadLM` around it)."""
    mods: dict[str, list[torch.nn.Module]] = {"target": [pair.target.model, pair.target.net]}
    if pair.draft is not None and pair.draft.model is not pair.target.model:
        mods["draft"] = [pair.draft.model, pair.draft.net]
    return ForwardClock(mods)


# -------------------------------------------------------------------------------- memory


def rss_mib() -> float:
    """Current resident set size (Linux /proc; falls back to the peak elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return peak_rss_mib()


def peak_rss_mib() -> float:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 if sys.platform != "darwin" else kb / 2**20


# --------------------------------------------------------------------------------- output


def cpu_line() -> str:
    """The CPU every figure was measured on: model, the ISA level torch dispatches to, and
    whether it has native bf16 arithmetic and AMX tiles (:mod:`mtad.runs.hardware`)."""
    from mtad.runs.hardware import cpu_features_text, cpu_model

    return f"{cpu_model()} [{torch.backends.cpu.get_cpu_capability()}, {cpu_features_text()}]"


def environment_line(args: argparse.Namespace | None = None) -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    parts = [
        f"torch {torch.__version__}",
        f"cpu {cpu_line()}",
        f"{os.cpu_count()} cores",
        f"threads {torch.get_num_threads()}",
        f"load {load:.1f}",
        platform.python_version(),
    ]
    try:
        import transformers

        parts.insert(1, f"transformers {transformers.__version__}")
    except ImportError:  # pragma: no cover
        pass
    return "env: " + ", ".join(parts)


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A plain-text table (copy-pasteable into reports and READMEs)."""
    cells = [[str(c) for c in columns]] + [[_fmt(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    line = "  ".join("-" * w for w in widths)
    print(f"\n{title}")
    print(line)
    for j, r in enumerate(cells):
        print(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=False))
            )
        )
        if j == 0:
            print(line)
    print(line)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v != v:
            return "-"
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole else float("nan")


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")
