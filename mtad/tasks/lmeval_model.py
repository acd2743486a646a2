"""The lm-eval model ``mtad``: any of our decoding methods behind lm-eval's ``TemplateLM``.

:class:`MTADLM` is registered with lm-eval as ``"mtad"``. ``generate_until`` runs the harness's
decoding method (MTAD, SpS, AR, ...) through :class:`~mtad.tasks.generator.TextGenerator`,
honouring ``until`` and ``max_gen_toks``; sampling settings in ``gen_kwargs`` (``do_sample``,
``temperature``) are ignored because the method's config owns the warping. ``loglikelihood`` and
``loglikelihood_rolling`` score with the target model alone (:mod:`mtad.tasks.quality`), with
lm-eval's own context/continuation split (``TemplateLM``) and rolling windows.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from mtad.engine import Decoder
from mtad.engine.runner import ModelRunner
from mtad.engine.tiny import build_tiny_pair, build_tiny_tokenizer
from mtad.methods import build_method
from mtad.tasks.generator import TextGenerator
from mtad.tasks.quality import continuation_logprobs, max_context
from mtad.tasks.samples import Generation

if TYPE_CHECKING:
    from lm_eval.api.instance import Instance
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

_IGNORED_GEN_KWARGS = ("do_sample", "temperature", "top_k", "top_p")


@register_model("mtad")
class MTADLM(TemplateLM):
    """lm-eval model around a :class:`TextGenerator` (our decoder) and the target model.

    Built by the harness from built objects (``generator``, ``target_model``), or from simple
    arguments for the ``tiny`` test pair: ``MTADLM(pair="tiny", method="ar", ...)`` or
    ``--model mtad --model_args pair=tiny,method=mtad,gamma=4``.
    """

    backend = "causal"

    def __init__(
        self,
        generator: TextGenerator | None = None,
        target_model: PreTrainedModel | None = None,
        *,
        pair: str | None = None,
        method: str = "ar",
        family: str = "llama",
        seed: int = 0,
        max_length: int | None = None,
        max_gen_toks: int = 256,
        **method_params: Any,
    ) -> None:
        super().__init__()
        if generator is None:
            if pair != "tiny":
                raise ValueError(
                    "MTADLM: pass a built `generator` and `target_model`, or pair=tiny for the "
                    "random test pair"
                )
            generator, target_model = _tiny_generator(method, family, seed, method_params)
        elif method_params:
            raise ValueError(f"MTADLM: method parameters {sorted(method_params)} need pair=tiny")
        if target_model is None:
            target_model = generator.decoder.target.model  # type: ignore[attr-defined]
        self.generator = generator
        self.tokenizer = generator.tokenizer
        self.target_model = target_model
        self._max_length = max_length
        self.max_gen_toks = max_gen_toks
        self.generations: dict[tuple[str | None, int | None], list[Generation]] = {}
        self._warned: set[str] = set()

    # ------------------------------------------------------------------ lm-eval properties

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self._max_length or max_context(self.target_model) or 2048

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "mtad")).replace("/", "__")

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **_: Any
    ) -> list[int]:
        special = True if add_special_tokens is None else add_special_tokens
        return self.tokenizer(string, add_special_tokens=special)["input_ids"]

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        return self.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    # ----------------------------------------------------------------------- scoring

    def _loglikelihood_tokens(
        self, requests: list[tuple[tuple[str, str], list[int], list[int]]], **_: Any
    ) -> list[tuple[float, bool]]:
        out = []
        for key, context, continuation in requests:
            logp, greedy = continuation_logprobs(
                self.target_model, context, continuation, self.max_length
            )
            result = (float(logp.double().sum()), greedy)
            if key is not None and key[0] is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
            out.append(result)
        return out

    def loglikelihood_rolling(
        self, requests: list[Instance], disable_tqdm: bool = False
    ) -> list[float]:
        out = []
        for (text,) in [r.args for r in requests]:
            tokens = self.tok_encode(text, add_special_tokens=False)
            windows = [
                make_disjoint_window(w)
                for w in get_rolling_token_windows(
                    tokens, self.prefix_token_id, self.max_length, context_len=1
                )
            ]
            total = sum(
                ll for ll, _ in self._loglikelihood_tokens([(None, c, t) for c, t in windows])
            )
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        return out

    # --------------------------------------------------------------------- generation

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        out = []
        for req in requests:
            context, gen_kwargs = req.args
            gen_kwargs = dict(gen_kwargs or {})
            until = gen_kwargs.pop("until", None)
            if isinstance(until, str):
                until = [until]
            stop = list(until or [])
            eos_text = self.tokenizer.decode([self.eot_token_id])
            if eos_text and eos_text not in stop:
                stop.append(eos_text)
            max_new = int(gen_kwargs.pop("max_gen_toks", self.max_gen_toks))
            ignored = sorted(k for k in gen_kwargs if k in _IGNORED_GEN_KWARGS)
            if ignored and "sampling" not in self._warned:
                self._warned.add("sampling")
                log.warning(
                    "lm-eval gen_kwargs %s ignored: the decoding method's config sets sampling",
                    ignored,
                )
            bos = self.tokenizer.bos_token
            special = not (bos and context.startswith(bos))
            gen = self.generator(
                context,
                max_new_tokens=max_new,
                stop=stop,
                add_special_tokens=special,
                key=f"lm_eval/{req.task_name}/{req.doc_id}/{req.idx}",
                max_prompt_tokens=max(1, self.max_length - max_new),
            )
            self.generations.setdefault((req.task_name, req.doc_id), []).append(gen)
            self.cache_hook.add_partial("generate_until", req.args, gen.text)
            out.append(gen.text)
        return out


def _tiny_generator(
    method: str, family: str, seed: int, params: dict[str, Any]
) -> tuple[TextGenerator, PreTrainedModel]:
    tokenizer = build_tiny_tokenizer()
    target, draft = build_tiny_pair(family=family, seed=seed)
    decoder = Decoder(
        build_method(method, **params),
        ModelRunner(target, "target"),
        ModelRunner(draft, "draft"),
        eos_token_ids=[tokenizer.eos_token_id],
        seed=seed,
    )
    return TextGenerator(decoder, tokenizer, seed), target
