"""Layer-wise readouts (``--layers``, the logit lens at the slot): the spec's parser, and the lens against a
brute-force computation on an independent path.

The brute force runs one unbatched forward per option sequence (the prompt and the whole option) with
``output_hidden_states=True``, applies the final norm and the head by hand (the norm only below the last layer:
Transformers' last hidden state comes out of the final norm), normalizes in float64 and scores the options by the
trie from the conditionals it read. The engine's lens (hooks on the blocks at the read positions, the batch's
paths) must agree within 1e-5 nats at every layer, multi-token and prefix options included, and equal the stored
final readout exactly at the last layer.
"""

from __future__ import annotations

import math

import pytest

from engines.trie import build_trie, normalize, option_logprobs
from probe.layers import LayerSpec, parse_layers
from tests.conftest import make_trial

TOL = 1e-5
"""Nats: the lens against the brute force, float32, on the tiny models, for a log-probability near 0; one of size
|l| is held to TOL x (1 + |l|) (:func:`nats_off`). float32 keeps a log-probability to a relative 6e-8 and two
summation orders drift by a few of those: an option at -23 nats (an early layer, think mode) came out 1.04e-5 from the
brute force under ``ATEN_CPU_CAPABILITY=default`` (4.3e-7 relative), under 1e-5 with this CPU's AVX-512 kernels."""


def nats_off(got: float, want: float) -> float:
    """|got - want| in units of (1 + |want|) nats: float32's rounding of a log-probability grows with its size (the
    logit and the log-sum-exp it is taken from both scale with it), as the vLLM conformance suite measures it."""
    return abs(got - want) / (1 + abs(want))
SMOL_TOL = 5e-5
"""Nats: the same on smol. Its log-probs differ from the brute force's by up to 4.2e-5 at middle layers (options at
-40 to -60 nats: a middle layer's logits spread wider than the final ones) and by up to 1.7e-5 at the last layer,
which is the final readout itself, on every path and at batch size 1 too: float32's rounding of a batched or
cached forward against one whole-sequence forward (the final readout's paths differ by up to 3.2e-5 among
themselves, docs/gpu.md), not the lens. The normalized probabilities agree within 2.4e-6 (:data:`TOL` holds)."""


# ------------------------------------------------------------------ the spec
def test_layer_specs_parse_and_resolve_on_a_model_of_l_blocks():
    assert parse_layers("all").resolve(4) == (0, 1, 2, 3, 4)
    assert parse_layers(" 12, 0,6,6 ").resolve(30) == (0, 6, 12)
    assert parse_layers("0,6,12").text == "0,6,12"
    assert parse_layers("every:4").resolve(10) == (0, 4, 8, 10)  # the final layer always closes the profile
    assert parse_layers("every:5").resolve(10) == (0, 5, 10)
    assert parse_layers("last:3").resolve(30) == (28, 29, 30)
    assert parse_layers("last:99").resolve(2) == (0, 1, 2)
    assert parse_layers("EVERY:2") == LayerSpec("every", k=2)


@pytest.mark.parametrize(
    ("text", "named"),
    [("every:0", "'0'"), ("last:x", "'x'"), ("1,,2", "an empty entry"), ("-1", "'-1'"), ("top", "'top'")],
)
def test_a_bad_layer_spec_names_the_value_and_the_fix(text, named):
    with pytest.raises(ValueError) as e:
        parse_layers(text)
    assert named in str(e.value) and "every:K or last:K" in str(e.value)


def test_a_layer_past_the_model_names_its_last_layer():
    with pytest.raises(ValueError, match="layer 31 is past this model's last layer 30"):
        parse_layers("0,31").resolve(30)


def test_layers_setting_is_canonical_and_checked_at_construction():
    from engines.hf.settings import HFSettings

    assert HFSettings(model="tiny", layers="12, 0").layers == "0,12"
    with pytest.raises(ValueError, match="every:K"):
        HFSettings(model="tiny", layers="every:-1")


# ------------------------------------------------------------------ brute force
def _norm_and_head(module):
    base = module.model
    norm = getattr(base, "norm", None) or base.norm_f
    return norm, module.lm_head


def brute_force_layers(engine, trial) -> dict[int, list[float]]:
    """layer -> option log-probs, from one unbatched forward per option sequence with every hidden state."""
    import torch

    module = engine.model
    norm, head = _norm_and_head(module)
    weight = head.weight.detach().float()
    prompt = list(engine.render(trial))
    options = engine.option_ids(trial)
    trie = build_trie(options)
    n_blocks = module.config.num_hidden_layers
    cond: dict[int, dict[tuple[int, ...], dict[int, float]]] = {lay: {} for lay in range(n_blocks + 1)}
    with torch.inference_mode():
        for opt in options:
            ids = torch.tensor([prompt + list(opt)])
            out = module(input_ids=ids, output_hidden_states=True, use_cache=False)
            hs = out.hidden_states
            assert len(hs) == n_blocks + 1
            for layer in range(n_blocks + 1):
                for i in range(len(opt)):  # the node opt[:i] is read at the position before token i
                    node = tuple(opt[:i])
                    if node in trie:
                        h = hs[layer][0, len(prompt) - 1 + i]
                        h = h if layer == n_blocks else norm(h[None])[0]
                        lp = torch.log_softmax((h.float() @ weight.T).double(), dim=-1)
                        cond[layer].setdefault(node, {}).update({t: float(lp[t]) for t in trie[node]})
                node = tuple(opt)
                if node in trie:  # a prefix of a longer option: read after its last token too
                    h = hs[layer][0, len(prompt) - 1 + len(opt)]
                    h = h if layer == n_blocks else norm(h[None])[0]
                    lp = torch.log_softmax((h.float() @ weight.T).double(), dim=-1)
                    cond[layer].setdefault(node, {}).update({t: float(lp[t]) for t in trie[node]})
    return {layer: option_logprobs(options, trie, c) for layer, c in cond.items()}


def _trials(n: int):
    """Trials with single-token, multi-token and prefix options (digits are single tokens: 1, 10, 100)."""
    kinds = [
        ("Rate it from 0 to 100. Question {k}?", ["1", "10", "100", "9", "90"]),
        ("Do you agree, case {k}? Answer yes or no.", ["yes", "no"]),
        ("Pick one for story {k}.", ["strongly agree", "agree", "disagree"]),
    ]
    out = []
    for k in range(n):
        user, opts = kinds[k % len(kinds)]
        out.append(make_trial(user.format(k=k // len(kinds)), opts, trial_id=f"t{k}"))
    return out


def _check_against_brute_force(engine, trials, brute_every: int = 1, tol: float = TOL):
    readouts = engine.readout(trials)
    worst = 0.0
    for k, (t, r) in enumerate(zip(trials, readouts, strict=True)):
        layers = [lay.layer for lay in r.layers]
        assert layers == list(range(engine.model.config.num_hidden_layers + 1))
        last = r.layers[-1]  # the last layer is the stored final readout, exactly
        assert last.logprobs == tuple(s.logprob for s in r.scores)
        assert last.probs == tuple(s.prob for s in r.scores)
        assert (last.coverage, last.greedy_option) == (r.coverage, r.greedy_option)
        if k % brute_every:
            continue
        brute = brute_force_layers(engine, t)
        for lay in r.layers:
            want = brute[lay.layer]
            probs, mass = normalize(want)
            for got, exp in zip(lay.logprobs, want, strict=True):
                if got == exp:  # both -inf included: an option's continuations took all of the mass in float64
                    continue
                assert math.isfinite(got) and math.isfinite(exp), (lay.layer, got, exp)
                worst = max(worst, nats_off(got, exp))
            assert lay.probs == pytest.approx(probs, abs=TOL)
            assert lay.coverage == pytest.approx(mass, abs=TOL)
            assert lay.greedy_option == t.options[max(range(len(want)), key=lambda i: (want[i], -i))]
    assert worst <= tol, f"lens vs brute force: {worst:.3g} nats per (1 + |log p|)"
    return readouts


@pytest.fixture(scope="module")
def tiny_lens():
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings

    return HFEngine(HFSettings(model="tiny", layers="all", batch_size=1)).load()


@pytest.mark.parametrize("path", ["tree", "branch", "plain"])
@pytest.mark.parametrize("batch", [1, 64])
def test_lens_matches_brute_force_on_every_path_tiny_moe(tiny_lens, path, batch):
    engine = tiny_lens.variant(readout_path=path, batch_size=batch)
    trials = _trials(6 if batch == 1 else 64)
    _check_against_brute_force(engine, trials, brute_every=1 if batch == 1 else 7)


@pytest.mark.parametrize("model", ["tiny-hybrid", "tiny-hybrid-dense"])
@pytest.mark.parametrize("path", ["branch", "plain"])
def test_lens_matches_brute_force_on_the_hybrids(model, path):
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings

    engine = HFEngine(HFSettings(model=model, layers="all", readout_path=path, batch_size=3)).load()
    _check_against_brute_force(engine, _trials(3))


def test_lens_in_think_mode_reads_the_slot_after_the_reasoning(tiny_lens):
    engine = tiny_lens.variant(think=True, think_budget=8, readout_path="plain")
    trials = _trials(3)
    readouts = engine.readout(trials)
    assert all(r.reasoning_tokens > 0 for r in readouts)
    bare = tiny_lens.variant(readout_path="plain")
    for t, r in zip(trials, readouts, strict=True):  # the brute force reads after the same prompt ids
        brute = brute_force_layers(_Rendered(bare, t, r.prompt_ids), t)
        for lay in r.layers:
            assert max(nats_off(a, b) for a, b in zip(lay.logprobs, brute[lay.layer], strict=True)) <= TOL


class _Rendered:
    """An engine whose prompt for ``trial`` is the given ids (the slot after think mode's reasoning)."""

    def __init__(self, engine, trial, ids):
        self._engine, self._trial, self._ids = engine, trial, ids
        self.model = engine.model

    def render(self, trial):
        assert trial is self._trial
        return self._ids

    def option_ids(self, trial):
        return self._engine.option_ids(trial)


def test_a_subset_of_layers_reads_those_layers_with_the_same_values(tiny_lens):
    trials = _trials(3)
    every = tiny_lens.variant(readout_path="plain").readout(trials)
    some = tiny_lens.variant(readout_path="plain", layers="0").readout(trials)
    for a, b in zip(every, some, strict=True):
        assert [lay.layer for lay in b.layers] == [0]  # a list reads the layers it names, no more
        # the same values, up to float32 rounding: the lens takes several layers in one matrix product
        assert b.layers[0].logprobs == pytest.approx(a.layers[0].logprobs, abs=1e-9, rel=1e-6)
        assert b.layers[0].greedy_option == a.layers[0].greedy_option


def test_without_layers_a_readout_has_none_and_its_run_key_is_unchanged(tiny_lens):
    plain = tiny_lens.variant(layers=None)
    assert plain.readout(_trials(1))[0].layers == ()
    assert "layers" not in plain.identity()
    assert tiny_lens.identity()["layers"] == "all"
    assert {k: v for k, v in tiny_lens.identity().items() if k != "layers"} == plain.identity()


def test_bfloat16_with_a_float32_head_reads_the_last_layer_as_the_final_readout():
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings

    bf = HFEngine(HFSettings(model="tiny", dtype="bfloat16", layers="all", readout_path="plain")).load()
    for r in bf.readout(_trials(3)):
        assert r.layers[-1].logprobs == tuple(s.logprob for s in r.scores)
        assert all(math.isfinite(x) for lay in r.layers for x in lay.logprobs)
    assert bf.describe()["head_dtype"] == "float32"


def test_a_head_the_lens_does_not_reproduce_is_refused_naming_the_model(tiny_lens):
    from probe.errors import ModelError

    engine = tiny_lens.variant(readout_path="plain")
    lens = engine._reader.lens()
    assert lens is not None
    lens.norm = _Doubled(lens.norm)  # as if the norm were applied twice
    with pytest.raises(ModelError, match=r"'tiny'.*without --layers"):
        engine.readout(_trials(1))


class _Doubled:
    def __init__(self, norm):
        self.norm = norm

    def __call__(self, h):
        return self.norm(self.norm(h) * 3.0)

    def parameters(self):
        return self.norm.parameters()


@pytest.mark.slow
@pytest.mark.parametrize("path", ["tree", "branch", "plain"])
def test_lens_matches_brute_force_on_smol(smol_engine, path):
    engine = smol_engine.variant(layers="all", readout_path=path, batch_size=4)
    _check_against_brute_force(engine, _trials(4), tol=SMOL_TOL)
