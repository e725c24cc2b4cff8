"""Mechanisms from outside the package: import paths, the lra.attention entry point, errors.

Uses the example package examples/my_attention, installed in editable mode by .ci/run (as a
user's ``pip install -e .`` would), and throw-away modules and distributions written to
tmp_path and put on sys.path.
"""

import textwrap

import jax
import pytest
from conftest import make_config
from flax import nnx

import lra.models
from lra.models import registry
from lra.models.encoder import Encoder
from lra.train.model import build_model

PATH = "my_attention.attention:SquaredReluAttention"


@pytest.fixture
def fresh_registry(monkeypatch):
    """Forget outside classes loaded by earlier tests (the registry caches them)."""
    monkeypatch.setattr(registry, "_LOADED", {})


def write_module(folder, name, source):
    (folder / f"{name}.py").write_text(textwrap.dedent(source))


def write_distribution(folder, name, entry_points):
    """A minimal installed distribution: ``name-0.1.dist-info`` declaring ``entry_points``."""
    info = folder / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    lines = [f"{k} = {v}" for k, v in entry_points.items()]
    (info / "entry_points.txt").write_text("[lra.attention]\n" + "\n".join(lines) + "\n")


def test_import_path_builds_the_outside_class():
    attn = lra.models.make_attention(PATH, dim=8, num_heads=2, max_len=16, rngs=nnx.Rngs(0))
    assert type(attn).__name__ == "SquaredReluAttention"
    assert registry.source(PATH) == PATH


def test_entry_point_name_from_the_installed_example():
    assert "my_attention" in registry.available()
    assert "my_attention" not in lra.models.ATTENTION_NAMES  # built-ins only
    assert registry.get("my_attention") is registry.get(PATH)
    assert registry.source("my_attention") == f"{PATH} from my-attention 0.1.0"


def test_outside_mechanisms_in_a_config_and_in_a_per_layer_schedule():
    cfg = make_config(
        "model=transformer",
        "model.attention=my_attention",
        "task.arch.num_layers=1",
        "task.arch.dim=16",
        "task.arch.qkv_dim=16",
        "task.arch.mlp_dim=16",
    )
    model = build_model(cfg, nnx.Rngs(params=jax.random.key(0)))
    assert type(model.encoder.blocks[0].attention).__name__ == "SquaredReluAttention"
    encoder = Encoder(
        vocab_size=8, dim=16, qkv_dim=16, num_heads=2, mlp_dim=16, max_len=8, num_layers=2,
        dropout=0.0, attention_dropout=0.0, positions="sinusoidal", cls_token=False,
        attention={"lower": PATH, "upper": "softmax"}, rngs=nnx.Rngs(0),
    )  # fmt: skip
    kinds = [type(block.attention).__name__ for block in encoder.blocks]
    assert kinds == ["SquaredReluAttention", "SoftmaxAttention"]


def test_a_model_yaml_in_the_users_config_folder():
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "examples" / "my_attention" / "configs"
    cfg = make_config(f"hydra.searchpath=[file://{folder}]", "model=my_attention")
    assert cfg.model.name == "my_attention" and cfg.model.attention == "my_attention"


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_such_package.attention:Mine", "cannot import module 'no_such_package.attention'"),
        ("my_attention.attention:Nope", "has no attribute 'Nope'"),
        ("my_attention.attention", "unknown attention mechanism"),
        ("my_attention.attention:", "both parts non-empty"),
        ("my_attention.attention:jnp", "is not an nnx.Module subclass"),
    ],
)
def test_bad_import_paths_name_the_module_and_the_problem(path, message, fresh_registry):
    with pytest.raises(registry.RegistryError, match=message):
        registry.get(path)


def test_a_module_that_raises_on_import_is_reported(tmp_path, monkeypatch, fresh_registry):
    write_module(tmp_path, "raising_attention", "raise RuntimeError('needs a GPU')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(registry.RegistryError, match="RuntimeError: needs a GPU"):
        registry.get("raising_attention:Mine")


def test_a_wrong_signature_is_reported(tmp_path, monkeypatch, fresh_registry):
    write_module(
        tmp_path,
        "unmasked_attention",
        """
        from flax import nnx

        class NoMask(nnx.Module):
            def __init__(self, *, dim, num_heads, max_len, rngs, qkv_dim=None, dropout_rate=0.0):
                pass

            def __call__(self, x, *, deterministic=True, rngs=None):
                return x

        class NoDropout(nnx.Module):
            def __init__(self, *, dim, num_heads, max_len, rngs):
                pass

            def __call__(self, x, *, mask, deterministic=True, rngs=None):
                return x
        """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(registry.RegistryError, match=r"NoMask.__call__ does not take mask;"):
        registry.get("unmasked_attention:NoMask")
    with pytest.raises(registry.RegistryError, match=r"__init__ does not take qkv_dim, dropout"):
        registry.get("unmasked_attention:NoDropout")


def test_entry_point_clashing_with_a_builtin(tmp_path, monkeypatch, fresh_registry):
    write_distribution(tmp_path, "shadowing", {"softmax": PATH})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(registry.RegistryError, match="clash: shadowing 0.1 declares entry point"):
        registry.get("softmax")


def test_entry_point_declared_by_two_packages(tmp_path, monkeypatch, fresh_registry):
    write_distribution(tmp_path, "first", {"twice": PATH})
    write_distribution(tmp_path, "second", {"twice": "my_attention.broken:MaskIgnoringAttention"})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(registry.RegistryError, match="more than one installed package") as err:
        registry.get("twice")
    assert "first 0.1" in str(err.value) and "second 0.1" in str(err.value)


def test_entry_point_that_cannot_load(tmp_path, monkeypatch, fresh_registry):
    write_distribution(tmp_path, "gone", {"gone_attention": "gone_module:Gone"})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "gone_attention" in registry.available()
    with pytest.raises(registry.RegistryError, match="cannot load entry point 'gone_module:Gone'"):
        registry.get("gone_attention")
