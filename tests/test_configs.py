"""Every config composes and validates (Hydra compose API, no model loads); bad values are
reported on one line naming the key; the run signature ignores exactly the non-result keys."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
from command_line import check_command_line
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from mtad.config_types import field_defaults
from mtad.cpu import native_bf16
from mtad.engine.spec import ModelSpec
from mtad.harness.config import ConfigError, validate
from mtad.runs.identity import RunIdentity

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"


def names(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose_cfg(*overrides: str, hydra: bool = False) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


@pytest.fixture(scope="module")
def smoke() -> DictConfig:
    return compose_cfg("+experiment=smoke")


def with_values(cfg: DictConfig, *assignments: str) -> DictConfig:
    """A copy of ``cfg`` with ``key=value`` assignments (values parsed as YAML)."""
    cfg = cfg.copy()
    for assignment in assignments:
        key, value = assignment.removeprefix("+").split("=", 1)
        OmegaConf.update(cfg, key, OmegaConf.create(f"v: {value}").v, force_add=True)
    return cfg


def test_optional_groups_stay_out_of_the_defaults_list() -> None:
    defaults = OmegaConf.load(CONF / "config.yaml").defaults
    groups = {next(iter(d)) for d in defaults if isinstance(d, dict) or OmegaConf.is_dict(d)}
    assert {"pair", "method", "task", "logger", "energy", "hydra"} <= groups
    assert not groups & {"experiment", "sweep"}


def test_default_run_is_smollm2_mtad_prompts() -> None:
    cfg = compose_cfg()
    assert (cfg.pair.name, cfg.method.name, cfg.task.name) == ("smollm2", "mtad", "prompts")
    assert cfg.logger.name == "wandb" and cfg.energy.tracker == "offline"


@pytest.mark.parametrize("name", names("experiment"))
def test_every_experiment_composes_and_validates(name: str) -> None:
    cfg = compose_cfg(f"+experiment={name}")
    spec = validate(cfg)
    assert spec.method_name == "mtad"
    if name == "smoke":
        assert spec.target.loader == "tiny" and spec.cfg.runtime.device == "cpu"
    elif name == "compare":  # the default pair, offline on the CPU
        assert spec.target.loader == "smollm2_gguf" and spec.cfg.runtime.device == "cpu"
    else:
        assert spec.target.loader == "hub" and spec.cfg.runtime.device == "cuda"


@pytest.mark.parametrize(
    ("preset", "target", "draft"),
    [
        ("llama70b", "meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-7b-hf"),
        ("llama3_8b", "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.2-1B"),
    ],
)
def test_preset_prints_both_models_without_loading(preset: str, target: str, draft: str) -> None:
    """``python run.py +experiment=<preset> --cfg job`` composes and names both models."""
    out = subprocess.run(
        [sys.executable, "run.py", f"+experiment={preset}", "--cfg", "job"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    cfg = OmegaConf.create(out.stdout)
    assert cfg.pair.target.path == target
    assert cfg.pair.draft.path == draft
    assert cfg.method.name == "mtad" and cfg.method.tau == 0.5
    assert cfg.results.study == "paper" and {"paper", cfg.pair.name} <= set(cfg.tags)


@pytest.mark.parametrize("name", names("sweep"))
def test_every_sweep_composes(name: str) -> None:
    cfg = compose_cfg(f"+sweep={name}", hydra=True)
    params = cfg.hydra.sweeper.params
    assert params
    for key, values in params.items():
        if (CONF / key).is_dir():  # a group swept over its options
            assert set(str(values).split(",")) <= set(names(key))
        else:
            assert OmegaConf.select(cfg, key) is not None, key


@pytest.mark.parametrize("name", names("pair"))
def test_every_pair_validates(name: str) -> None:
    spec = validate(compose_cfg(f"pair={name}"))
    assert spec.cfg.pair.name == name
    assert spec.draft is not None
    if spec.target.loader == "hub":
        assert spec.target.device_map == "auto" and spec.target.dtype == "float16"
    base = name.removesuffix("_eagle").removesuffix("_head")  # the same pair, a head as draft
    # smollm2's default draft follows the CPU (tests/test_default_draft.py)
    head = base != name or (name == "smollm2" and native_bf16() is not None)
    assert (spec.draft.kind == "head") == head
    chat = base == "smollm2" or base.endswith(("_chat", "_instruct"))
    assert spec.cfg.pair.chat_template == chat
    assert spec.cfg.pair.notes  # every pair says where its draft choice comes from


def test_method_configs_match_the_registry() -> None:
    from mtad.methods import METHODS, build_params
    from mtad.methods.params import PARAMS

    assert set(names("method")) == set(METHODS) == set(PARAMS)
    for name in METHODS:
        assert METHODS[name][0] is PARAMS[name]  # registered with its params dataclass
        spec = validate(compose_cfg(f"method={name}"))
        # the composed config has every parameter (Hydra overrides only existing keys), at the
        # dataclass defaults (the one place of the defaults), from Hydra's ConfigStore
        composed_keys = set(compose_cfg(f"method={name}").method) - {"name"}
        assert composed_keys == set(spec.method_params)
        assert spec.params == build_params(name)  # built once, from the config
        assert spec.method_params == dataclasses.asdict(spec.params)


def test_task_configs_match_their_params() -> None:
    """Each task's keyword options are its params dataclass's fields, and a keyword default
    that is a value (not a None or "default" that stands for the task's own) is the field's."""
    from mtad.tasks import TASKS, task_class
    from mtad.tasks.params import PARAMS

    assert set(names("task")) == set(TASKS) == set(PARAMS)
    for name in TASKS:
        defaults = field_defaults(PARAMS[name])
        options: dict[str, object] = {}
        for klass in reversed(task_class(name).__mro__):  # a subclass's own default wins
            init = klass.__dict__.get("__init__")
            for p in inspect.signature(init).parameters.values() if init else ():
                if p.kind is p.KEYWORD_ONLY:
                    options[p.name] = p.default
        assert set(options) == set(defaults), name
        for key, default in options.items():
            if default is not None and default != "default":
                assert default == defaults[key], f"{name}: {key}"


@pytest.mark.parametrize("group", ["method", "task"])
def test_yamls_take_their_defaults_from_the_params(group: str) -> None:
    """``conf/<group>/<name>.yaml`` composes its dataclass's defaults first (Hydra's
    ConfigStore) and sets only values that differ from them: a default is written once."""
    params = importlib.import_module(f"mtad.{group}s.params").PARAMS
    for name in names(group):
        own = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{name}.yaml"))
        assert isinstance(own, dict)
        assert own.pop("defaults") == [f"params/{name}@_here_", "_self_"], name
        defaults = json.loads(json.dumps(field_defaults(params[name])))  # tuples as lists
        assert set(own) <= set(defaults), f"{name}: {sorted(set(own) - set(defaults))}"
        repeated = sorted(k for k, v in own.items() if v == defaults[k])
        assert not repeated, f"conf/{group}/{name}.yaml repeats the defaults of {repeated}"


BAD_VALUES = [
    ("method.gamma=0", "method.gamma"),
    ("method.tau=1.5", "method.tau"),
    ("method.name=foo", "method.name"),
    ("+method.foo=1", "method.foo"),
    ("method.top_p=0", "method.top_p"),
    ("pair.target.dtype=int8", "pair.target.dtype"),
    ("pair.draft.loader=s3", "pair.draft.loader"),
    ("runtime.threads=0", "runtime.threads"),
    ("runtime.device=tpu", "runtime.device"),
    ("logger.mode=loud", "logger.mode"),
    ("energy.tracker=meter", "energy.tracker"),
    ("results.study=a/b", "results.study"),
    ("task.limit=-1", "task.limit"),
    ("+task.foo=1", "task.foo"),
    ("pair.draft=null", "pair.draft"),  # mtad needs a draft
]


@pytest.mark.parametrize(("override", "key"), BAD_VALUES)
def test_bad_values_name_their_key_on_one_line(smoke: DictConfig, override: str, key: str) -> None:
    from mtad.harness.job import prepare

    cfg = with_values(smoke, override)
    with pytest.raises(ConfigError) as info:
        prepare(cfg)  # validation + task data; loads no model
    assert info.value.key == key
    assert str(info.value).startswith(f"{key}: ") and "\n" not in str(info.value)


def test_sections_typed_before_come_back_as_new_objects_and_bad_values_still_fail(
    smoke: DictConfig,
) -> None:
    """validate() types each distinct section once (a planner validates ~1,300 runs): a caller
    that sets a field of one run's spec changes no other run's, and a section that differs
    from a valid one by one bad value is checked, not served from the valid one."""
    specs = [validate(smoke) for _ in range(3)]  # the first typed, the others served
    for field_of in (lambda s: s.target, lambda s: s.cfg.runtime, lambda s: s.cfg.pair.target):
        assert len({id(field_of(spec)) for spec in specs}) == 3
    served = specs[1]
    served.target.dtype, served.cfg.runtime.threads = "float16", 7
    again = validate(smoke)
    assert again.target.dtype == specs[0].target.dtype != "float16"
    assert again.cfg.runtime.threads == specs[0].cfg.runtime.threads != 7
    assert dataclasses.asdict(again.cfg) == dataclasses.asdict(specs[0].cfg)
    for override, key in (
        ("pair.target.dtype=int8", "pair.target.dtype"),
        ("runtime.threads=0", "runtime.threads"),
    ):
        with pytest.raises(ConfigError) as info:
            validate(with_values(smoke, override))
        assert info.value.key == key


@pytest.mark.parametrize(
    ("argv", "key"),
    [
        (["method=foo"], "method"),
        (["pair=nope"], "pair"),
        (["+experiment=llama7b"], "experiment"),
        (["task=glue"], "task"),
        (["hydra/launcher=nope"], "hydra/launcher"),
    ],
)
def test_unknown_group_choice_is_caught_before_hydra(argv: list[str], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_command_line(argv, CONF)
    assert info.value.key == key and "choose from" in str(info.value)


def test_known_group_choices_pass() -> None:
    check_command_line(
        [
            "method=ar,mtad",
            "pair=tiny",
            "+experiment=smoke",
            "method.gamma=2,3",
            "hydra/launcher=joblib",
        ],
        CONF,
        multirun=True,
    )
    # a preset that sweeps (the paper presets run their recipes) takes several values too
    check_command_line(["+experiment=llama70b", "method.gamma=2,3"], CONF)


@pytest.mark.parametrize(
    ("argv", "key", "message"),
    [
        (["method.gama=4"], "method.gama", "not a parameter of 'mtad'; did you mean method.gamma?"),
        (["method=ar", "method.gamma=4"], "method.gamma", "not a parameter of 'ar' (has "),
        (["pair.target.dtyp=x"], "pair.target.dtyp", "did you mean pair.target.dtype?"),
        (["runtime.seed=abc"], "runtime.seed", "must be an integer, got 'abc'"),
        (["method.tau=0.1,0.2"], "method.tau", "0.1,0.2 is several values"),
        (["method=sps,mtad"], "method", "sps,mtad is several values: add -m to run each"),
        (["method.gamma=[1"], "overrides", "no viable alternative at input '[1'"),
    ],
)
def test_command_line_errors_are_one_line_naming_the_key(
    argv: list[str], key: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        check_command_line(argv, CONF)
    assert info.value.key == key and message in info.value.message
    assert "\n" not in str(info.value)


def _signature(cfg: DictConfig, *assignments: str) -> str:
    from mtad.harness.job import prepare

    return prepare(with_values(cfg, *assignments)).signature


def test_signature_ignores_logging_device_and_output_keys(smoke: DictConfig) -> None:
    base = _signature(smoke)
    assert _signature(compose_cfg("+experiment=smoke", "logger=none")) == base
    same = [
        "logger.project=other",
        "energy.country_iso_code=FRA",
        "energy.log_level=info",
        "results.root=elsewhere",
        "results.study=other",
        "runtime.progress=false",
        "runtime.device=cpu",
        "tags=[x]",
    ]
    for assignment in same:
        assert _signature(smoke, assignment) == base, assignment
    # placement neither, under a loader that reads it (the tiny loader refuses device_map: #19)
    local = smoke.copy()
    for role in ("target", "draft"):
        spec = ModelSpec(loader="local", path="assets/drafts/smollm2-draft")
        local.pair[role] = OmegaConf.structured(spec)
    assert _signature(local, "pair.target.device_map=auto") == _signature(local)


def test_signature_follows_result_relevant_keys(smoke: DictConfig) -> None:
    base = _signature(smoke)
    changed = [
        "method.gamma=2",
        "method.tau=0.3",
        "runtime.seed=1",
        "task.limit=1",
        "pair.draft.tiny.seed=5",
        "runtime.warmup_tokens=0",
        "runtime.threads=2",  # the thread count decides a CPU run's timing
        "energy.measure_power_secs=5",  # polling shares the cores with decoding
        "energy.tracking_mode=machine",
    ]
    sigs = {_signature(smoke, a) for a in changed}
    sigs.add(_signature(compose_cfg("+experiment=smoke", "method=sps")))
    sigs.add(_signature(compose_cfg("+experiment=smoke", "energy=none")))
    assert base not in sigs and len(sigs) == len(changed) + 2
    # params at their defaults, spelled out or not, hash the same (defaults are filled in)
    assert _signature(smoke, "method.gamma=4") == base
    assert _signature(smoke, "method.tau=0.5", "method.replacement=false") == base
    # the thread count as the run uses it: null is this torch's count
    import torch

    assert _signature(smoke, "runtime.threads=null") == _signature(
        smoke, f"runtime.threads={torch.get_num_threads()}"
    )


def test_signature_is_stable_and_readable() -> None:
    config = {
        "method": {"name": "mtad", "gamma": 4},
        "pair": {"name": "tiny"},
        "task": {"name": "prompts"},
        "runtime": {"seed": 0, "threads": 3},
    }
    machine = {"device_kind": "cpu", "cpu_model": "x", "cpu_bf16": "none", "threads": 1}
    sig = RunIdentity.of(config, machine).signature
    assert sig.startswith("mtad-tiny-prompts-") and len(sig.rsplit("-", 1)[1]) == 10
    config["runtime"]["threads"] = 1  # the setting: the count in the hardware is what counts
    assert RunIdentity.of(config, machine).signature == sig


def test_missing_local_model_folder_is_reported_before_loading(smoke: DictConfig) -> None:
    from mtad.harness.job import prepare

    def local_draft(cfg: DictConfig) -> DictConfig:
        # the local loader reads no tiny options: the tiny preset's are refused unless null (#19)
        local = ["pair.draft.loader=local", "pair.draft.path=assets/drafts/nothing"]
        return with_values(cfg, *local, "pair.draft.tiny=null")

    with pytest.raises(ConfigError) as info:
        prepare(local_draft(smoke))
    assert info.value.key == "pair.draft.path" and "nothing is missing" in str(info.value)
    # a method without a draft does not need the draft's folder
    ar = compose_cfg("+experiment=smoke", "method=ar")
    prepare(local_draft(ar))


def test_one_string_for_a_list_of_strings_is_one_item_not_its_characters() -> None:
    """``task.stop=###`` is the stop string '###' (it used to become '#', '#', '#'); a string
    for a list of numbers is refused by the method's own check."""
    from mtad.methods import build_params
    from mtad.tasks import build_task

    assert build_task({"name": "prompts", "stop": "###"}).stop == ("###",)
    assert build_task({"name": "prompts", "stop": ["a", "bc"]}).stop == ("a", "bc")
    with pytest.raises(ValueError, match=r"must be a non-empty list of ints >= 1, got 'abc'"):
        build_params("specinfer", branching="abc")


def test_sweep_jobs_are_the_basic_sweepers_product_in_its_order() -> None:
    """The sweep callback's job list (validated before any job starts, counted for Ctrl-C) is
    the one Hydra's basic sweeper launches: the preset's params, a command-line value replacing
    a param's in its place, then the cartesian product, first key outermost."""
    from mtad.harness.callbacks import basic_sweeper, sweep_jobs

    overrides = ["+experiment=smoke", "+sweep=mtad_grid", "method.gamma=2,3", "method.tau=0.5"]
    cfg = check_command_line(overrides, CONF, multirun=True)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        jobs = sweep_jobs(cfg)
    params = dict(cfg.hydra.sweeper.params)
    assert basic_sweeper(cfg) and list(params) == [
        "method.gamma",
        "method.tau",
        "method.beam_width",
    ]
    widths = params["method.beam_width"].split(",")
    expected = [
        [
            "method.gamma=" + g,
            "method.tau=0.5",
            "method.beam_width=" + b,
            "+experiment=smoke",
            "+sweep=mtad_grid",
        ]
        for g in ("2", "3")
        for b in widths
    ]
    assert jobs == expected
