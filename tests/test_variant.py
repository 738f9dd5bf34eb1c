"""Variant parsing: single configs, autotune lists, and overrides that cannot apply cleanly."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kernelcamp.errors import KernelcampError
from kernelcamp.variant import LaunchConfig, parse_variant

CONF = Path(__file__).resolve().parents[1] / "conf"


@pytest.mark.parametrize("path", sorted((CONF / "variant").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_variant_file_parses_and_is_named_after_its_file(path: Path) -> None:
    v = parse_variant(yaml.safe_load(path.read_text()))
    assert v.name == path.stem, "a variant's name is its conf file name (DESIGN.md: one name per thing)"
    assert len(v.configs) >= 1


def test_single_config_has_no_autotune() -> None:
    v = parse_variant({"name": "a", "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 8, "num_stages": 2})
    assert v.single and not v.is_list and v.autotune_key == ()
    assert v.configs[0] == LaunchConfig(16, 16, 8, 2, "auto")


def test_list_variant_keeps_order_and_key() -> None:
    raw = yaml.safe_load((CONF / "variant" / "story_autotune.yaml").read_text())
    v = parse_variant(raw)
    assert v.is_list and v.autotune_key == ("B",)
    assert [(c.BLOCK_T, c.num_warps) for c in v.configs] == [(16, 4), (32, 4), (32, 8)]


def test_top_level_field_on_list_variant_says_what_to_write() -> None:
    raw = yaml.safe_load((CONF / "variant" / "story_autotune.yaml").read_text())
    raw["num_warps"] = 8  # what `-S +variant.num_warps=8` produces
    with pytest.raises(
        KernelcampError, match=r"variant.configs.0.num_warps=.*single-config|single-config.*variant.configs.0.num_warps"
    ):
        parse_variant(raw)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"num_wraps": 8}, "unknown key"),
        ({"BLOCK_T": 8}, "BLOCK_T = 8: must be >= 16"),
        ({"BLOCK_H": 24}, "power of two"),
        ({"num_warps": "8"}, "expected an integer"),
        ({"num_splits": 0}, "num_splits = 0"),
        ({"autotune_key": ["B"]}, "autotune_key does not apply"),
    ],
)
def test_bad_single_config_is_rejected(change: dict, match: str) -> None:
    raw = {"name": "a", "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 8, "num_stages": 2, **change}
    with pytest.raises(KernelcampError, match=match):
        parse_variant(raw)


def test_config_hash_ignores_name_but_not_configs() -> None:
    a = parse_variant({"name": "a", "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 8, "num_stages": 2})
    b = parse_variant({"name": "b", "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 8, "num_stages": 2})
    c = parse_variant({"name": "a", "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2})
    assert a.config_hash() == b.config_hash() != c.config_hash()


def test_restricted_keeps_chosen_configs_and_refuses_none() -> None:
    v = parse_variant(yaml.safe_load((CONF / "variant" / "story_autotune.yaml").read_text()))
    assert [c.BLOCK_T for c in v.restricted([0]).configs] == [16]
    with pytest.raises(KernelcampError, match="no config left"):
        v.restricted([])


def _row(**kw):
    return {"BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2, **kw}


def test_batch_table_chooses_rows_by_batch_size():
    v = parse_variant({"name": "t", "configs": [_row(max_batch=1), _row(max_batch=16, BLOCK_T=32), _row(num_warps=8)]})
    assert v.is_table and v.autotune_key == ()
    assert [v.config_for_batch(b).label() for b in (1, 2, 16, 17, 128)] == [
        "T16_H16_w4_s2_kauto_b1",
        "T32_H16_w4_s2_kauto_b16",
        "T32_H16_w4_s2_kauto_b16",
        "T16_H16_w8_s2_kauto",
        "T16_H16_w8_s2_kauto",
    ]
    # max_batch is part of the config hash, and configs without it hash as before the field existed
    other = parse_variant(
        {"name": "t", "configs": [_row(max_batch=2), _row(max_batch=16, BLOCK_T=32), _row(num_warps=8)]}
    )
    assert other.config_hash() != v.config_hash()
    assert "max_batch" not in LaunchConfig(16, 16, 4, 2).as_dict()


@pytest.mark.parametrize(
    "configs,extra,match",
    [
        ([_row(max_batch=8), _row()], {"autotune_key": ["B"]}, "autotune_key does not apply"),
        ([_row(max_batch=8), _row(max_batch=64)], {}, r"configs.1.max_batch = 64: the last row"),
        ([_row(max_batch=8), _row(), _row()], {}, r"configs.1.max_batch is missing"),
        ([_row(max_batch=8), _row(max_batch=8), _row()], {}, r"configs.1.max_batch = 8: must be larger"),
        ([_row(max_batch=0), _row()], {}, r"configs.0.max_batch = 0: must be >= 1"),
        ([_row(max_batch=1.5), _row()], {}, r"configs.0.max_batch = 1.5: expected an integer"),
    ],
)
def test_bad_batch_table_is_one_line_naming_the_row(configs, extra, match):
    with pytest.raises(KernelcampError, match=match):
        parse_variant({"name": "t", "configs": configs, **extra})


def test_max_batch_on_a_single_config_says_where_it_belongs():
    with pytest.raises(KernelcampError, match="max_batch belongs to a row of a batch table"):
        parse_variant({"name": "t", **_row(max_batch=8)})


def test_a_config_label_parses_back_to_its_config():
    for cfg in (LaunchConfig(16, 16, 4, 2, "auto"), LaunchConfig(64, 64, 8, 1, 32)):
        assert LaunchConfig.from_label(cfg.label()) == cfg
    # a batch-table row: its label carries the bound, its config label does not and parses back
    row = LaunchConfig(64, 16, 8, 2, "auto", max_batch=8)
    assert row.label() == "T64_H16_w8_s2_kauto_b8" and row.config_label() == "T64_H16_w8_s2_kauto"
    assert LaunchConfig.from_label(row.config_label()) == LaunchConfig(64, 16, 8, 2, "auto")
    for bad in ("T16_H16_w4_s2", "T16_H16_w4_s2_kx", "X16_H16_w4_s2_kauto", "T16_H16_w4_s2_kauto_b8"):
        with pytest.raises(ValueError, match=rf"config '{bad}': expected T<BLOCK_T>_H<BLOCK_H>_w<warps>"):
            LaunchConfig.from_label(bad)
