"""The per-token model of self-pretraining (issue 28): shapes, causality, and an encoder
subtree that matches the classifier's (the hand-off copies it across)."""

import jax
import numpy as np
import pytest
from flax import nnx

import lra.models
from lra.models.pretrain import TokenPredictor

VOCAB = 13


def _kwargs(**over):
    kw = dict(
        vocab_size=VOCAB,
        max_len=16,
        num_layers=2,
        dim=8,
        qkv_dim=8,
        num_heads=2,
        mlp_dim=16,
        dropout=0.1,
        attention_dropout=0.0,
        positions="learned",
        attention="softmax",
    )
    kw.update(over)
    return kw


def _batch(b=3, n=12):
    tokens = np.random.default_rng(0).integers(0, VOCAB, size=(b, n)).astype(np.int32)
    return tokens, np.array([12, 7, 0], np.int32)[:b]


def _shapes(state):
    return {
        jax.tree_util.keystr(path).removesuffix(".value"): np.shape(leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]
    }


@pytest.mark.parametrize("causal", [False, True])
def test_output_shape_and_dropout(causal):
    model = lra.models.build_token_predictor(
        outputs=VOCAB + 1, causal=causal, rngs=nnx.Rngs(0), **_kwargs()
    )
    assert isinstance(model, TokenPredictor)
    tokens, lengths = _batch()
    out = model(tokens, lengths)
    assert out.shape == (3, 12, VOCAB + 1)
    assert np.isfinite(np.asarray(out)).all()
    trained = model(tokens, lengths, deterministic=False, rngs=jax.random.key(1))
    assert trained.shape == out.shape
    with pytest.raises(ValueError, match="rngs"):
        model(tokens, lengths, deterministic=False)


def test_mask_token_one_past_the_vocabulary_is_embedded():
    """The masked objective feeds id == vocab_size; built with vocab_size + 1 rows it is a
    real embedding (finite output), not an out-of-range lookup."""
    model = TokenPredictor(
        outputs=VOCAB, causal=False, rngs=nnx.Rngs(0), **_kwargs(vocab_size=VOCAB + 1)
    )
    tokens, lengths = _batch()
    tokens[:, ::3] = VOCAB
    assert np.isfinite(np.asarray(model(tokens, lengths))).all()


def test_causal_predictor_does_not_look_ahead():
    model = TokenPredictor(
        outputs=5,
        causal=True,
        rngs=nnx.Rngs(0),
        **_kwargs(attention=["transnormer_diag", "transnormer_norm"]),
    )
    tokens, lengths = _batch()
    out = np.asarray(model(tokens, lengths))
    changed = tokens.copy()
    changed[:, 5:] = (changed[:, 5:] + 1) % VOCAB
    later = np.asarray(model(changed, lengths))
    np.testing.assert_allclose(later[:2, :5], out[:2, :5], atol=1e-5)
    assert np.abs(later[0, 5:] - out[0, 5:]).max() > 1e-4


@pytest.mark.parametrize(
    ("attention", "causal", "positions"),
    [
        ("softmax", True, "learned"),
        ("cosformer", False, "sinusoidal"),
        (["transnormer_diag", "transnormer_norm"], True, "learned"),
        ("s5", True, "sinusoidal"),
    ],
)
@pytest.mark.parametrize("dual", [False, True])
def test_encoder_subtree_matches_the_classifiers(attention, causal, positions, dual):
    """Same paths and shapes under ``encoder``; only the embedding table's first dim differs
    (vocab_size + 1 rows for the mask token). Classifier pooling is mean (no CLS vector)."""
    options = {"s5": {"state_size": 4, "blocks": 1}} if attention == "s5" else None
    kw = _kwargs(attention=attention, positions=positions, attention_options=options)
    predictor = TokenPredictor(
        outputs=VOCAB, causal=causal, rngs=nnx.Rngs(0), **{**kw, "vocab_size": VOCAB + 1}
    )
    classifier = lra.models.build_classifier(
        dual=dual, num_classes=3, pooling="mean", rngs=nnx.Rngs(0), **kw
    )
    pre = _shapes(nnx.state(predictor.encoder, nnx.Param))
    cls = _shapes(nnx.state(classifier.encoder, nnx.Param))
    assert pre.keys() == cls.keys()
    embedding = [k for k in pre if "embedding" in k]
    assert len(embedding) == 1
    assert pre.pop(embedding[0]) == (VOCAB + 1, 8)
    assert cls.pop(embedding[0]) == (VOCAB, 8)
    assert pre == cls
    # The head is outside the encoder: stage 2 drops it.
    assert set(_shapes(nnx.state(predictor, nnx.Param))) - {
        "['encoder']" + k for k in _shapes(nnx.state(predictor.encoder, nnx.Param))
    } == {"['head']['bias']", "['head']['kernel']"}


def test_cls_pooling_classifier_differs_only_by_the_cls_vector():
    kw = _kwargs()
    predictor = TokenPredictor(outputs=VOCAB, causal=True, rngs=nnx.Rngs(0), **kw)
    classifier = lra.models.build_classifier(
        dual=False, num_classes=3, pooling="cls", rngs=nnx.Rngs(0), **kw
    )
    pre = _shapes(nnx.state(predictor.encoder, nnx.Param))
    cls = _shapes(nnx.state(classifier.encoder, nnx.Param))
    # A CLS classifier has one more vector and one more learned position.
    assert set(cls) - set(pre) == {"['embedder']['cls']"}
    assert pre["['embedder']['pos']"] == (16, 8) and cls["['embedder']['pos']"] == (17, 8)


def test_refusals():
    with pytest.raises(ValueError, match="'flash' has no causal mode"):
        TokenPredictor(outputs=3, causal=True, rngs=nnx.Rngs(0), **_kwargs(attention="flash"))
    TokenPredictor(outputs=3, causal=False, rngs=nnx.Rngs(0), **_kwargs(attention="flash"))
    with pytest.raises(ValueError, match="outputs"):
        TokenPredictor(outputs=0, causal=False, rngs=nnx.Rngs(0), **_kwargs())
    with pytest.raises(TypeError, match="pooling"):
        TokenPredictor(outputs=3, causal=False, rngs=nnx.Rngs(0), pooling="cls", **_kwargs())


LENGTH_SHAPED = ("linformer", "flash", "synthesizer_random")  # parameters shaped by the length


@pytest.mark.parametrize("attention", lra.models.registry.names())
def test_layers_built_for_the_classifiers_length_hand_over_their_shapes(attention):
    # Linformer's projections, FLASH's relative bias and Synthesizer's tables are shaped by the
    # length the layers are built for, which a CLS classifier makes max_len + 1: the predictor
    # (no CLS token) builds its layers for that length too (lra.train.model.predictor_kwargs).
    kw = _kwargs(attention=attention, positions="sinusoidal")
    predictor = TokenPredictor(
        outputs=VOCAB, causal=False, rngs=nnx.Rngs(0), attention_max_len=17, **kw
    )
    # The models compared only by their shapes are built abstractly (no initialiser runs).
    classifier = nnx.eval_shape(
        lambda: lra.models.build_classifier(
            dual=False, num_classes=3, pooling="cls", rngs=nnx.Rngs(0), **kw
        )
    )
    pre = _shapes(nnx.state(predictor.encoder.blocks, nnx.Param))
    assert pre == _shapes(nnx.state(classifier.encoder.blocks, nnx.Param))
    if attention in LENGTH_SHAPED:  # not vacuous: built for max_len they would not load
        plain = nnx.eval_shape(
            lambda: TokenPredictor(outputs=VOCAB, causal=False, rngs=nnx.Rngs(0), **kw)
        )
        assert _shapes(nnx.state(plain.encoder.blocks, nnx.Param)) != pre
    tokens, lengths = _batch(n=16)
    assert predictor(tokens, lengths).shape == (3, 16, VOCAB)
