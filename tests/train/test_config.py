"""Training configs: presets, files, overrides and their errors, the command line."""

from __future__ import annotations

import json

import pytest

from taylorshift.cli import main
from taylorshift.models import create_model
from taylorshift.train import (
    PRESETS,
    ConfigError,
    OptimConfig,
    TrainConfig,
    get_preset,
    resolve_config,
)

# The paper's Table 6: model preset (depth, d_emb, heads, MLP), lr, batch.
TABLE_6 = {
    "listops": ((4, 512, 8, 2), 1e-3, 256),
    "cifar-pixel": ((1, 256, 4, 1), 5e-4, 256),
    "imdb-byte": ((4, 256, 4, 4), 5e-5, 32),
}


@pytest.mark.parametrize("name", sorted(TABLE_6))
def test_paper_presets_follow_table_6(name):
    config = get_preset(name)
    (depth, dim, heads, mlp), lr, batch = TABLE_6[name]
    model = create_model(config.model.name, device="meta").config
    assert (model.depth, model.dim, model.num_heads, model.mlp_ratio) == (depth, dim, heads, mlp)
    assert (model.dropout, model.drop_path, model.pos_embedding) == (0.0, 0.05, "cosine")
    assert (config.optim.lr, config.data.batch_size) == (lr, batch)
    o = config.optim
    assert (o.name, o.epochs, o.warmup_epochs, o.weight_decay) == ("lamb", 200, 5.0, 1e-3)
    assert config.run.amp == "auto"  # bf16 on CUDA GPUs that support it
    assert config.data.task == name


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_round_trips_through_a_dict(name):
    config = get_preset(name)
    assert TrainConfig.from_dict(config.to_dict()) == config
    assert json.loads(json.dumps(config.to_dict())) == config.to_dict()


def test_overrides_are_typed_from_text():
    config = resolve_config(
        "listops-cpu",
        overrides=[
            ("optim.lr", "3e-4"),
            ("optim.betas", "0.9,0.98"),
            ("optim.grad_clip", "none"),
            ("run.progress", "false"),
            ("data.batch_size", "64"),
            ("data.options.path", "/data/listops"),
            ("data.options.exact_length", "true"),
            ("data.split_options.train.num_samples", "100"),
            ("model.overrides.depth", "3"),
            ("model.kernel", "softmax"),
        ],
    )
    assert config.optim.lr == 3e-4 and config.optim.betas == (0.9, 0.98)
    assert config.optim.grad_clip is None and config.run.progress is False
    assert config.data.batch_size == 64
    assert config.data.options["path"] == "/data/listops"  # not JSON: kept as text
    assert config.data.options["exact_length"] is True
    assert config.data.options["max_depth"] == 4  # the preset's other options stay
    assert config.data.split_options["train"] == {"num_samples": 100}
    assert config.model.overrides == {"depth": 3} and config.model.kernel == "softmax"


def test_typed_values_and_replace():
    config = resolve_config("listops-tiny", overrides={"optim.lr": 5e-3, "run.seed": 7})
    assert (config.optim.lr, config.run.seed) == (5e-3, 7)
    assert config.replace(**{"optim.epochs": 3}).optim.epochs == 3
    assert TrainConfig(optim=OptimConfig(lr=0.5)).optim.lr == 0.5


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("optim.lrr", "1", r"unknown setting 'optim\.lrr' \(did you mean 'optim\.lr'"),
        ("optimizer.lr", "1", r"unknown setting 'optimizer\.lr': no section 'optimizer'"),
        ("lr", "1", r"must be written section\.name .* got 'lr'"),
        ("optim.lr", "fast", r"optim\.lr must be a number; got 'fast'"),
        ("data.batch_size", "2.5", r"data\.batch_size must be an int; got '2\.5'"),
        ("run.progress", "maybe", r"run\.progress must be a bool; got 'maybe'"),
        ("optim.lr", "-1", r"optim\.lr must be a number > 0; got -1"),
        ("optim.name", "sgd", r"optim\.name must be one of 'lamb', 'adamw'; got 'sgd'"),
        ("run.amp", "fp8", r"run\.amp must be one of 'auto', 'bf16', 'off'; got 'fp8'"),
        ("data.batch_size", "0", r"data\.batch_size must be a positive int; got 0"),
        ("optim.warmup_epochs", "500", r"optim\.warmup_epochs must be in \[0, optim\.epochs"),
        (
            "model.mode",
            "fast",
            r"model\.mode must be one of 'auto', 'direct', 'efficient'; got 'fast'",
        ),
        ("optim.lr.x", "1", r"optim\.lr is a number, not a table"),
        ("data.split_options.dev.num_samples", "1", r"split_options keys must be among"),
        ("optim.lr_multipliers.temperature", "0", r"optim\.lr_multipliers must map .* 0"),
        ("optim.lr_multipliers.temperature", "fast", r"optim\.lr_multipliers must map"),
        ("run.device", "gpu", r"run\.device must be auto, cpu, cuda\[:N\], mps or xpu\[:N\]"),
        (  # an option set without its kernel: the message shows where it goes
            "model.kernel_args.window",
            "3",
            r"model\.kernel_args\.window must be a table of kernel options, got 3: model\."
            r"kernel_args holds \{kernel: \{option: value\}\}, e\.g\. --set "
            r"model\.kernel_args\.taylorshift\.window=3$",
        ),
        (  # a kernel's options given as a value: the example names no option
            "model.kernel_args.taylorshift",
            "5",
            r"e\.g\. --set model\.kernel_args\.taylorshift\.OPTION=5$",
        ),
    ],
)
def test_bad_overrides_name_the_key(key, value, match):
    with pytest.raises(ConfigError, match=match):
        resolve_config("listops-cpu", overrides=[(key, value)])


@pytest.mark.parametrize(
    ("optim", "match"),
    [
        ({"epochs": 2.5}, r"optim\.epochs must be a positive int; got 2\.5"),
        ({"lr": "1e-3"}, r"optim\.lr must be a number > 0; got '1e-3'"),
        ({"lr": float("inf")}, r"optim\.lr must be a finite number > 0; got inf"),
        (
            {"lr_multipliers": {"temperature": float("inf")}},
            r"optim\.lr_multipliers must map .* to finite numbers > 0, got 'temperature': inf",
        ),
        ({"weight_decay": -0.1}, r"optim\.weight_decay must be a number >= 0; got -0\.1"),
    ],
)
def test_sections_built_directly_are_checked_too(optim, match):
    # A wrong type or value is a ConfigError (what `taylorshift train` prints as one line),
    # also when the section skipped the type check of from_dict.
    with pytest.raises(ConfigError, match=match):
        TrainConfig(optim=OptimConfig(**optim))


def test_mode_needs_the_taylorshift_kernel():
    with pytest.raises(ConfigError, match=r"model\.mode applies to the taylorshift kernel"):
        resolve_config("listops-cpu", overrides={"model.kernel": "softmax", "model.mode": "direct"})


def test_unknown_preset_is_refused_with_a_suggestion():
    with pytest.raises(
        ConfigError, match=r"unknown preset 'listops-cp' \(did you mean 'listops-cpu'"
    ):
        resolve_config("listops-cp")


def test_toml_and_json_files(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text(
        'preset = "listops-tiny"\n[optim]\nname = "adamw"\nlr = 5e-4\nbetas = [0.9, 0.95]\n'
        "[data.options]\nmax_depth = 3\n"
    )
    config = resolve_config(file=toml)
    assert config.optim.name == "adamw" and config.optim.betas == (0.9, 0.95)
    assert config.data.options == {"min_len": 8, "max_len": 32, "max_depth": 3}  # merged
    assert config.data.batch_size == get_preset("listops-tiny").data.batch_size
    # overrides win over the file, an explicit preset over the file's
    config = resolve_config("listops-cpu", toml, {"optim.lr": "1e-2"})
    assert (config.optim.lr, config.data.batch_size) == (1e-2, 32)

    path = tmp_path / "run.json"
    path.write_text(json.dumps({"run": {"seed": 3}, "model": {"kernel": "linear"}}))
    config = resolve_config(file=path)
    assert (config.run.seed, config.model.kernel) == (3, "linear")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[optim]\nlrr = 1.0\n", r"unknown setting 'optim\.lrr'"),
        ("[optimizer]\nlr = 1.0\n", r"no section 'optimizer'"),
        ("[optim]\nlr = 'high'\n", r"optim\.lr must be a number; got 'high'"),
        ("[optim]\nepochs = 2.5\n", r"optim\.epochs must be an int; got 2\.5"),
        ("[optim\n", r"is not valid TOML"),
        ("preset = 5\n", r"preset must be a preset name, one of listops, .*; got 5$"),
        ("[run]\nseed = 99999999999999999999\n", r"run\.seed must be an int in \[-9223"),
        (b"[optim]\nname = 'caf\xe9'\n", r"bad\.toml must be UTF-8 text: 'utf-8' codec"),
    ],
)
def test_bad_files_name_the_problem(tmp_path, text, match):
    path = tmp_path / "bad.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match=match):
        resolve_config(file=path)


def test_cli_prints_the_resolved_config(capsys):
    argv = ["train", "--preset", "listops-cpu", "--kernel", "softmax", "--lr", "2e-4"]
    argv += ["--set", "run.seed=5", "--set", "optim.lr=3e-4", "--print-config"]
    assert main(argv) == 0
    config = TrainConfig.from_dict(json.loads(capsys.readouterr().out))
    assert (config.model.kernel, config.run.seed) == ("softmax", 5)
    assert config.optim.lr == 3e-4  # --set comes last


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--set", "optim.lrr=1"], "unknown setting 'optim.lrr' (did you mean 'optim.lr'"),
        (["--set", "optim.lr"], "expected KEY=VALUE"),
        (["--preset", "nope"], "invalid choice: 'nope'"),
        (["--mode", "fast"], "invalid choice: 'fast'"),
    ],
)
def test_cli_config_errors_exit_2(capsys, argv, match):
    with pytest.raises(SystemExit) as excinfo:
        main(["train", *argv, "--print-config"])
    assert excinfo.value.code == 2
    assert match in capsys.readouterr().err


def test_another_task_than_the_presets_drops_its_task_options():
    # listops-cpu's ListOps lengths and sample counts mean nothing to listops-tsv
    config = resolve_config(overrides={"data.task": "listops-tsv", "data.options.path": "x"})
    assert config.data.options == {"path": "x"} and config.data.split_options == {}
    # the preset's own task keeps them
    kept = resolve_config("listops-cpu", overrides={"data.task": "listops"})
    assert kept.data.options == get_preset("listops-cpu").data.options


def _kernel_args_of(config):
    from taylorshift.data import get_task
    from taylorshift.train.build import model_overrides

    spec = get_task(config.data.task)
    model = create_model(
        config.model.name, device="meta", **model_overrides(config, spec, spec.num_classes)
    )
    return model.config.attn_kernel, model.config.kernel_args


def test_kernel_args_apply_to_their_kernel_only():
    per_kernel = {"model.kernel_args": {"taylorshift": {"temperature": 8.0}}}
    config = resolve_config("listops-cpu", overrides=per_kernel)
    kernel, args = _kernel_args_of(config)
    assert kernel == "taylorshift" and args["temperature"] == 8.0
    # another kernel does not see them (softmax takes no temperature)
    softmax = resolve_config("listops-cpu", overrides={**per_kernel, "model.kernel": "softmax"})
    assert _kernel_args_of(softmax) == ("softmax", {})
    # explicit overrides and mode win; the model's own options are kept
    base = _kernel_args_of(resolve_config("listops-cpu"))[1]
    both = resolve_config(
        "listops-cpu",
        overrides={
            **per_kernel,
            "model.overrides.kernel_args.temperature": "2",
            "model.mode": "efficient",
        },
    )
    assert _kernel_args_of(both)[1] == {**base, "temperature": 2, "mode": "efficient"}


def test_kernel_args_are_set_per_key_from_the_command_line():
    config = resolve_config("recall", overrides={"model.kernel_args.taylorshift.temperature": "1"})
    assert config.model.kernel_args["taylorshift"]["temperature"] == 1
    assert _kernel_args_of(config)[1]["temperature"] == 1


def test_kernel_args_refuse_unknown_kernels_and_non_tables():
    with pytest.raises(ConfigError, match=r"model\.kernel_args\.taylorshift must be a table"):
        resolve_config("listops-cpu", overrides={"model.kernel_args": {"taylorshift": 8}})
    config = resolve_config(
        "listops-cpu", overrides={"model.kernel_args": {"taylorshfit": {"temperature": 8}}}
    )
    with pytest.raises(ConfigError, match=r"kernel_args keys must be kernel names.*'taylorshfit'"):
        _kernel_args_of(config)


def test_recall_preset_starts_taylorshift_at_tau_8_and_softmax_without_it():
    # the recipe of benchmarks/recall_cpu/short-conv: τ0 = 8 for TaylorShift only
    config = resolve_config("recall")
    assert _kernel_args_of(config) == ("taylorshift", {"temperature": 8.0})
    softmax = resolve_config("recall", overrides={"model.kernel": "softmax"})
    assert _kernel_args_of(softmax) == ("softmax", {})


def test_text_bytes_preset_gives_taylorshift_a_local_head_and_softmax_none():
    # the recipe of benchmarks/parity (docs/accuracy.md): for the TaylorShift kernel only
    config = resolve_config("text-bytes-cpu")
    kernel, args = _kernel_args_of(config)
    assert kernel == "taylorshift" and (args["local_heads"], args["window"]) == (1, 32)
    assert (
        "local_heads"
        not in _kernel_args_of(
            resolve_config("text-bytes-cpu", overrides={"model.kernel": "softmax"})
        )[1]
    )
    paper = resolve_config(
        "text-bytes-cpu", overrides={"model.kernel_args.taylorshift.local_heads": "0"}
    )
    assert _kernel_args_of(paper)[1]["local_heads"] == 0
    # the lm preset keeps every head TaylorShift (sequence parallelism takes no local heads)
    assert "local_heads" not in _kernel_args_of(resolve_config("lm"))[1]
