"""Runs the authors' MTAD (``BatchMTADStrategy``) in its own interpreter, for bench/vs_authors.py.

Started by ``bench/vs_authors.py`` with ``--authors-python`` (a venv with ``torch==2.13.0
transformers==4.44.2``) so that the two transformers versions never meet. It speaks JSON
lines on stdin/stdout: ``init`` (checkout path, model folders, settings), then one ``gen`` per
prompt (token ids in, token ids and timings out), then ``quit``. Nothing here is the authors'
code: their checkout is imported from the path given at run time, and only its
``inference.generate``, ``inference.strategies`` and ``utils`` modules -- never
``evaluation.py`` (hard-coded CUDA, an HF token, nvidia-smi) nor their forked llama.

Adaptations, all outside their files:
* ``utils.py`` imports pandas at import time (for Spider helpers MTAD does not use): a stub
  module with a real ``ModuleSpec`` stands in when pandas is absent;
* model folders written by transformers 5 keep ``rope_theta`` under ``rope_parameters``, which
  4.44 ignores (silently 10000, logits off by up to ~5.6): it is copied to ``rope_theta``;
* generation runs under ``torch.no_grad()`` (their code does not disable autograd).
Only token ids cross the process boundary, so no tokenizer is loaded here.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import json
import sys
import time
import types

PROTO = sys.stdout
sys.stdout = sys.stderr  # anything their code prints must not corrupt the protocol


def reply(obj: dict) -> None:
    PROTO.write(json.dumps(obj) + "\n")
    PROTO.flush()


def stub_pandas() -> None:
    if importlib.util.find_spec("pandas") is not None:
        return
    mod = types.ModuleType("pandas")
    mod.__spec__ = importlib.machinery.ModuleSpec("pandas", loader=None)
    sys.modules["pandas"] = mod


class Clock:
    """Time inside forward calls of the given modules (their code calls ``model.model`` and
    ``lm_head`` separately, so both are timed). ``forward`` is wrapped on the instance, as in
    bench/common.py's ForwardClock, so both sides are measured the same way."""

    def __init__(self, modules) -> None:
        self.seconds = 0.0
        self.calls = 0
        for m in modules:
            m.forward = self._wrap(m.forward)

    def _wrap(self, forward):
        @functools.wraps(forward)
        def timed_forward(*args, **kwargs):
            start = time.perf_counter()
            try:
                return forward(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1

        return timed_forward


def load_model(path: str, dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict) and "rope_theta" in rope:
        config.rope_theta = float(rope["rope_theta"])
    model = AutoModelForCausalLM.from_pretrained(path, config=config, torch_dtype=dtype)
    return model.eval()


def start(msg: dict, state: dict, torch: types.ModuleType) -> dict:
    """``init``: load both models and the authors' generator with the run's settings."""
    torch.set_num_threads(int(msg.get("threads", 1)))
    # The authors' checkout is no installed package: its modules (`inference`, `utils`)
    # import each other as top-level names from their `src/`, so that folder goes on
    # the path of this separate interpreter (never of ours).
    sys.path.insert(0, msg["src"])
    stub_pandas()
    import transformers
    from inference.generate import MTADGenerator  # the authors' module

    dtype = getattr(torch, msg["dtype"])
    target = load_model(msg["target"], dtype)
    draft = load_model(msg["draft"], getattr(torch, msg.get("draft_dtype", msg["dtype"])))
    s = msg["settings"]
    gen = MTADGenerator(
        draft,
        target,
        eos_token_id=int(msg["eos"]),
        k_config=tuple([1] * s["gamma"]),
        beam_width=s["beam_width"],
        accept_thres=s["tau"],
        max_new_tokens=int(msg["max_new"]),
        draft_model_temp=s["temperature"],
        target_model_temp=s["temperature"],
        replacement=False,
        tree_attn=False,
        top_k=s["top_k"],
        top_p=s["top_p"],
    )
    clock = Clock([target.model, target.lm_head, draft.model, draft.lm_head])
    state.update(gen=gen, clock=clock, target=target)
    return {
        "ok": True,
        "strategy": type(gen.strategy).__name__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "rope_theta": [target.config.rope_theta, draft.config.rope_theta],
    }


def generate(msg: dict, state: dict, torch: types.ModuleType) -> dict:
    """``gen``: one prompt through the authors' generator, timed."""
    gen, clock = state["gen"], state["clock"]
    gen.max_new_tokens = int(msg["max_new"])
    ids = torch.tensor([msg["ids"]], dtype=torch.long)
    torch.manual_seed(int(msg["seed"]))
    clock.seconds, clock.calls = 0.0, 0
    d0, v0 = gen.draft_time, gen.verify_time
    begin = time.perf_counter()
    with torch.no_grad():
        out = gen.generate(ids)
    wall = time.perf_counter() - begin
    return {
        "tokens": out.sequences[0, ids.shape[1] :].tolist(),
        "wall": wall,
        "forward_s": clock.seconds,
        "iterations": int(out.invocation_count),
        "accepted": int(out.acceptance_count),
        "draft_s": gen.draft_time - d0,
        "verify_s": gen.verify_time - v0,
    }


def main() -> None:
    import torch

    state: dict = {}
    for line in sys.stdin:
        msg = json.loads(line)
        cmd = msg["cmd"]
        if cmd == "init":
            reply(start(msg, state, torch))
        elif cmd == "gen":
            reply(generate(msg, state, torch))
        elif cmd == "quit":
            reply({"ok": True})
            return


if __name__ == "__main__":
    main()
