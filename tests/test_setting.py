"""A record's setting, variant and protocol (lra.config.setting) against the composed configs."""

from conftest import make_config
from omegaconf import OmegaConf

from lra.config.setting import REMOVED, describe_setting, diff_overrides, variant_name


def resolved(*overrides):
    return OmegaConf.to_container(make_config(*overrides), resolve=True)


def test_a_config_straight_from_its_files_is_its_protocol_and_model_name():
    for protocol in ("lra_official", "transnormer"):
        config = resolved("model=performer", "task=text", f"protocol={protocol}")
        described = describe_setting(config)
        assert described["overrides"] == {}
        assert described["variant"] == "performer"
        assert described["protocol"] == protocol


def test_seeds_and_paths_share_a_setting_but_steps_do_not():
    base = describe_setting(resolved("task=listops", "seed=0"))
    other_seed = describe_setting(resolved("task=listops", "seed=7", "data_dir=/elsewhere"))
    fewer_steps = describe_setting(resolved("task=listops", "trainer.num_steps=20"))
    assert base["setting"] == other_seed["setting"]
    assert other_seed["overrides"] == {} and other_seed["protocol"] == "lra_official"
    assert fewer_steps["setting"] != base["setting"]
    assert fewer_steps["overrides"] == {"trainer.num_steps": 20}
    assert fewer_steps["variant"] == "transformer[trainer.num_steps=20]"
    assert fewer_steps["protocol"] == "custom"


def test_restating_a_files_value_is_not_an_override():
    config = resolved("task=listops", "trainer.num_steps=5000", "trainer=default")
    assert describe_setting(config)["overrides"] == {}


def test_group_presets_and_attention_swaps_are_named():
    bf16 = describe_setting(resolved("task=listops", "trainer=bf16"))
    assert bf16["overrides"] == {"trainer.precision": "bf16"}
    assert bf16["protocol"] == "custom"
    swapped = describe_setting(resolved("task=listops", "model.attention=performer"))
    assert swapped["variant"] == "transformer[model.attention=performer]"
    assert swapped["setting"] != describe_setting(resolved("task=listops"))["setting"]


def test_diff_sees_added_and_removed_keys_and_variant_names_stay_short():
    reference = {"model": {"name": "m", "a": 1, "b": {"c": 2}}, "task": {"name": "t"}}
    config = {"model": {"name": "m", "a": 3, "d": 4}, "task": {"name": "t"}, "seed": 9}
    assert diff_overrides(config, reference) == {"model.a": 3, "model.b.c": REMOVED, "model.d": 4}
    empty = {"model": {"name": "m", "options": {}}}
    filled = {"model": {"name": "m", "options": {"softmax": {"implementation": "plain"}}}}
    assert diff_overrides(filled, empty) == {"model.options.softmax.implementation": "plain"}
    assert diff_overrides(empty, filled) == {
        "model.options": {},
        "model.options.softmax.implementation": REMOVED,
    }
    many = {f"trainer.key_number_{i}": i for i in range(20)}
    name = variant_name("m", many)
    assert name.startswith("m[trainer.key_number_0=0") and name.endswith("more]")
    assert len(name) < 120
    assert variant_name("m", None) == "m[no reference]"
    assert len(variant_name("m", {"x": "y" * 200})) < 40


def test_the_transnormer_protocol_sets_the_authors_values_and_stays_itself():
    official = resolved("task=image", "model=transnormer_t2")
    theirs = resolved("task=image", "model=transnormer_t2", "protocol=transnormer")
    assert official["task"]["arch"]["num_layers"] == 1
    assert theirs["task"]["arch"]["num_layers"] == 12  # script_lra.py: 12 layers on CIFAR
    assert theirs["trainer"]["decay_steps"] == 50000 and theirs["trainer"]["b2"] == 0.999
    options = theirs["model"]["attention_options"]
    assert options["transnormer_norm"]["lrpe"] and options["transnormer_diag"]["lrpe"]
    assert not official["model"]["attention_options"]["transnormer_norm"]["lrpe"]
    assert describe_setting(theirs)["setting"] != describe_setting(official)["setting"]
    for task in ("listops", "text", "retrieval", "image", "pathfinder", "pathx"):
        for model in ("transnormer_t1", "flash", "performer"):
            config = resolved(f"task={task}", f"model={model}", "protocol=transnormer")
            described = describe_setting(config)
            assert described["protocol"] == "transnormer", (task, model, described)
            assert described["variant"] == model
    changed = resolved("task=text", "protocol=transnormer", "trainer.learning_rate=0.01")
    assert describe_setting(changed)["protocol"] == "custom"
