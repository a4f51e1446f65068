"""The plain prompt frame (``--frame plain``, and ``auto`` on a model without a chat template).

* The rendering is the documented one (docs/methods.md), checked against text written out here by hand, not
  by :mod:`engines.render`; kept replies are placed from their ids; replies are cut at the frame's stops.
* Readouts in the plain frame equal a brute-force scorer written independently of ``render.py``: the prompt
  text spelled out literally, one unbatched forward per option sequence, within 1e-5 nats in float32, on
  every readout path, on ``tiny-base`` (tiny without its chat template) and on ``smol``.
* The Transformers engine, the in-process vLLM engine and the server engine render the same ids.
* A chat-frame engine's run key holds no frame (it is the key it was before frames existed).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from engines import render
from probe.types import Message, Trial
from tests.conftest import make_trial

YESNO = "You are on a bridge. Is it morally acceptable to push the man? Answer with Yes or No."
SCALE = "How acceptable is it? On a scale from 0 to 100, answer with a number only."
SCALE_OPTIONS = [str(i) for i in range(0, 101, 5)]


# ------------------------------------------------------------------ the rendering, by hand
def test_plain_text_is_the_documented_layout():
    t = make_trial("Is it wrong?\n\nAnswer Yes or No.", ["Yes", "No"], system="Be brief.")
    assert render.plain_text(t) == "Be brief.\n\nQuestion: Is it wrong?\n\nAnswer Yes or No.\n\nAnswer:"
    bare = make_trial("Q?", ["Yes", "No"])
    assert render.plain_text(bare) == "Question: Q?\n\nAnswer:"
    assert render.plain_text(bare, "Sys") == "Sys\n\nQuestion: Q?\n\nAnswer:"  # --system where a trial has none
    turns = Trial(
        "t",
        "e",
        "i",
        {},
        (Message("user", "A?"), Message("assistant", "Yes"), Message("user", "Sure?")),
        ("Y",),
        ("y",),
    )
    assert render.plain_text(turns) == "Question: A?\n\nAnswer: Yes\n\nQuestion: Sure?\n\nAnswer:"


def test_options_follow_answer_with_a_space_and_the_prefix_after_it():
    t = make_trial("Q?", ["Yes", "No"])
    assert render.option_texts(t, "plain") == (" Yes", " No")
    assert render.option_texts(t, "chat") == ("Yes", "No")  # unchanged in the chat frame
    p = make_trial("Q?", ["Yes", "No"], prefix="My answer:")
    assert render.answer_suffix(p, "plain") == " My answer:"
    assert render.option_texts(p, "plain") == (" Yes", " No")
    spaced = make_trial("Q?", ["Yes", "No"], prefix="My answer is ")
    assert render.option_texts(spaced, "plain") == ("Yes", "No")


class _Tok:
    """A character tokenizer (id = code point), with or without a BOS the encoder adds and a chat template."""

    def __init__(self, bos: int | None = None, template: str | None = None) -> None:
        self.bos_token_id, self.chat_template, self.unk_token_id = bos, template, None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [ord(c) for c in text]
        return ([self.bos_token_id] if add_special_tokens and self.bos_token_id is not None else []) + ids

    def decode(self, ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool = False) -> str:
        return "".join(chr(i) for i in ids if i != self.bos_token_id)


def test_bos_only_where_the_tokenizer_adds_one_itself():
    t = make_trial("Q?", ["Yes", "No"])
    assert render.render_ids(_Tok(), t, think=False, frame="plain") == tuple(ord(c) for c in "Question: Q?\n\nAnswer:")
    with_bos = render.render_ids(_Tok(bos=1), t, think=False, frame="plain")
    assert with_bos[0] == 1 and with_bos[1:] == tuple(ord(c) for c in "Question: Q?\n\nAnswer:")


def test_resolve_frame():
    with_template, without = _Tok(template="{{ x }}"), _Tok()
    assert render.resolve_frame(with_template, "auto", "m") == "chat"
    assert render.resolve_frame(without, "auto", "m") == "plain"
    assert render.resolve_frame(with_template, "plain", "m") == "plain"
    with pytest.raises(ValueError, match="--frame plain"):
        render.resolve_frame(without, "chat", "m")
    with pytest.raises(ValueError, match="frame must be one of auto, chat, plain, got 'text'"):
        render.resolve_frame(without, "text", "m")
    with pytest.raises(ValueError, match="plain frame has none"):
        render.render_ids(without, make_trial("Q?", ["A"]), think=True, frame="plain")


def test_a_kept_reply_is_placed_from_its_ids_between_the_turns():
    tok = _Tok()
    first = make_trial("A?", ["Yes", "No"])
    reply = tuple(ord(c) for c in " Yes")
    t = Trial(
        "t",
        "e",
        "i",
        {},
        (Message("user", "A?"), Message("assistant", " Yes", reply_ids=reply), Message("user", "Sure?")),
        ("Yes", "No"),
        ("y", "n"),
    )
    parts = render.kept_parts(tok, t, 1, think=False, frame="plain")
    assert parts.head == render.render_ids(tok, first, think=False, frame="plain")
    assert parts.reply == reply
    assert tok.decode(parts.tail) == "\n\nQuestion: Sure?\n\nAnswer:"
    whole = tok.decode(render.render_ids(tok, t, think=False, frame="plain"))
    assert whole == "Question: A?\n\nAnswer: Yes\n\nQuestion: Sure?\n\nAnswer:"


@pytest.mark.parametrize(
    "reply,answer,stopped,spent",
    [
        (" Yes", " Yes", False, 4),  # no stop: the whole reply (cut off by the cap, or ended by eos)
        (" Yes\n\nQuestion: more", " Yes", True, 6),  # a blank line: spent up to its second newline
        (" No\nQuestion: next", " No", True, 13),  # a role label at the start of a line
        (" No\nAnswer: again", " No", True, 11),
        ("\n\n", "", True, 2),  # nothing before the stop: an empty answer (parsed as invalid)
        (" Yes, because\nthe rest", " Yes, because\nthe rest", False, 22),  # one newline is no stop
    ],
)
def test_plain_cut_by_hand(reply, answer, stopped, spent):
    tok = _Tok()
    cut = render.plain_cut(tok.decode, tok.encode(reply, add_special_tokens=False))
    assert (tok.decode(cut.ids), cut.stopped, cut.spent) == (answer, stopped, spent)


def test_a_token_that_straddles_the_stop_is_dropped_whole():
    vocab = {1: " Yes", 2: ".\n\n", 3: "Question:"}
    cut = render.plain_cut(lambda ids: "".join(vocab[i] for i in ids), [1, 2, 3])
    assert cut == render.PlainReply((1,), True, 2)


# ------------------------------------------------------------------ the engine against brute force
def plain_prompt(tok, user: str, system: str | None = None) -> list[int]:
    """The documented plain frame, spelled out here (not by engines.render), tokenized as the model's tokenizer
    tokenizes text by default (a BOS where it adds one itself)."""
    text = (f"{system}\n\n" if system else "") + f"Question: {user}\n\nAnswer:"
    return list(tok(text).input_ids)


def brute_force(model, prompt: list[int], options: list[list[int]]) -> list[float]:
    """log P(option is the whole answer): one unbatched, uncached forward per option sequence (float64 log-softmax),
    the chain rule over the option's tokens, less the mass that continues into a longer option."""

    def seq_logprob(seq: list[int]) -> tuple[float, torch.Tensor]:
        with torch.inference_mode():
            lp = torch.log_softmax(model(input_ids=torch.tensor([prompt + seq])).logits[0].double(), dim=-1)
        start = len(prompt) - 1
        return float(sum(lp[start + i, t] for i, t in enumerate(seq))), lp[start + len(seq)]

    out = []
    for o in options:
        lp, after = seq_logprob(o)
        conts = {oo[len(o)] for oo in options if len(oo) > len(o) and oo[: len(o)] == o}
        if conts:
            lp += math.log1p(-math.fsum(math.exp(float(after[c])) for c in conts))
        out.append(lp)
    return out


@pytest.fixture(scope="module")
def base_engine():
    """tiny without its chat template: ``--frame auto`` reads it in the plain frame."""
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings

    return HFEngine(HFSettings(model="tiny-base", batch_size=16)).load()


CASES = [
    (YESNO, ["Yes", "No"], None),
    (SCALE, SCALE_OPTIONS, "Answer with a number."),
    (YESNO, ["Yes, it is", "No", "Yes"], None),
]


def check_against_brute_force(engine, user, options, system, atol):
    trial = make_trial(user, options, system=system)
    r = engine.readout([trial])[0]
    tok = engine.tokenizer
    prompt = plain_prompt(tok, user, system)
    assert list(r.prompt_ids) == prompt
    want_ids = [tok.encode(" " + o, add_special_tokens=False) for o in options]
    assert [list(s.token_ids) for s in r.scores] == want_ids
    ref = brute_force(engine.model, prompt, want_ids)
    np.testing.assert_allclose([s.logprob for s in r.scores], ref, rtol=0, atol=atol)
    assert r.coverage == pytest.approx(math.fsum(math.exp(v) for v in ref), abs=atol)
    return r


@pytest.mark.parametrize("path", ["tree", "branch", "plain"])
@pytest.mark.parametrize("user,options,system", CASES, ids=["yesno", "scale", "multiword-prefix"])
def test_tiny_base_reads_the_plain_frame_as_brute_force(base_engine, path, user, options, system):
    assert base_engine.frame == "plain"
    check_against_brute_force(base_engine.variant(readout_path=path), user, options, system, atol=1e-5)


@pytest.mark.parametrize("batch", [1, 64])
def test_batched_plain_readouts_equal_brute_force(base_engine, batch):
    e = base_engine.variant(batch_size=batch)
    trials = [make_trial(f"{YESNO} ({i})", ["Yes", "No"], trial_id=f"t{i}") for i in range(64)]
    got = e.readout(trials)
    for i in (0, 31, 63):
        ids = [list(s.token_ids) for s in got[i].scores]
        ref = brute_force(e.model, plain_prompt(e.tokenizer, f"{YESNO} ({i})"), ids)
        np.testing.assert_allclose([s.logprob for s in got[i].scores], ref, rtol=0, atol=1e-5)


def test_smol_in_the_plain_frame_equals_brute_force(smol_engine):
    """The ids exactly; the values within smol's float32 bound (``scripts.vllm_parity.PARITY_BY_MODEL``, 1e-4: on
    30 layers float32 rounding alone moves a logprob by up to 5e-5, so no two float32 computations of it agree to
    1e-5; measured here: 1.4e-5 at most, on the 21-option scale)."""
    from scripts.vllm_parity import PARITY_BY_MODEL

    e = smol_engine.variant(frame="plain")
    assert e.frame == "plain" and smol_engine.frame == "chat"
    for user, options, system in CASES[:2]:
        check_against_brute_force(e, user, options, system, atol=PARITY_BY_MODEL["smol"])


def test_the_frame_enters_the_run_key_only_when_plain(base_engine, tiny_engine):
    assert "frame" not in tiny_engine.identity()  # a chat run keeps the key it had before frames existed
    assert base_engine.identity()["frame"] == "plain"
    assert base_engine.describe()["frame"] == {"used": "plain", "asked": "auto"}
    assert "frame" not in tiny_engine.describe() and "frame" not in tiny_engine.describe()["settings"]
    chat = tiny_engine.variant(frame="chat")  # asked for by name: recorded
    assert (
        chat.describe()["frame"] == {"used": "chat", "asked": "chat"} and chat.describe()["settings"]["frame"] == "chat"
    )
    assert "frame" not in chat.identity()
    assert base_engine.describe()["system_prompt"] == {"text": None, "source": None}


def test_chat_and_think_are_refused_in_one_line_on_a_model_without_a_template():
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings

    with pytest.raises(ValueError, match="has no chat template, so --frame chat cannot render it; use --frame plain"):
        HFEngine(HFSettings(model="tiny-base", frame="chat")).load()
    with pytest.raises(ValueError, match="no reasoning tags, so --think cannot run"):
        HFEngine(HFSettings(model="tiny-base", think=True)).load()
    with pytest.raises(ValueError, match="plain frame has none"):
        HFSettings(model="tiny", think=True, frame="plain")


# ------------------------------------------------------------------ sampling stops
def test_draws_stop_at_the_frame_and_equal_the_cut_of_a_whole_generation(base_engine):
    """Deterministic: each draw is seeded by (seed, trial, draw). The engine stops a draw once its text holds a stop;
    drawing the whole budget and cutting it (:func:`engines.render.plain_cut`) gives the same replies."""
    e = base_engine.variant(max_new_tokens=24, batch_size=8)
    trials = [make_trial(YESNO, ["Yes", "No"], trial_id=f"s{i}") for i in range(4)]
    got = e.sample(trials, n=6, temperature=1.0)
    rows = e._sampler.rows(trials, e._seeded_rows(trials, 6), False, plain=False)
    stops = e._stop_ids()
    whole = e._sampler.generate(rows, 6, 1.0, 24, stops, None)
    want = [
        e._parsed_reply(
            trials[r.trial], r, g, stops, truncated=len(g) >= 24 and g[-1] not in stops, stop_at_answer=False
        )
        for r, g in zip(rows, whole, strict=True)
    ]
    assert got == want
    for s in got:
        assert render.plain_stop(s.text) is None
        assert e.tokenizer.decode(list(s.token_ids), skip_special_tokens=False) == s.text
    assert any(render.plain_stop(e.tokenizer.decode(g, skip_special_tokens=False)) is not None for g in whole)


# ------------------------------------------------------------------ the other engines render the same ids
def test_vllm_and_server_engines_render_the_plain_frame_as_the_transformers_engine(base_engine):
    from engines.server.engine import ServerEngine
    from engines.server.settings import ServerSettings
    from engines.vllm.engine import VLLMEngine
    from engines.vllm.settings import VLLMSettings

    tok = base_engine.tokenizer
    vllm = VLLMEngine(VLLMSettings(model="tiny-base"), llm=object(), tokenizer=tok, model_path="/fake/tiny-base")
    server = ServerEngine(
        ServerSettings(provider="openai-compatible", model="tiny-base", base_url="http://x/v1"), tokenizer=tok
    )
    trials = [make_trial(u, o, system=s, trial_id=f"t{i}") for i, (u, o, s) in enumerate(CASES)]
    for other in (vllm, server):
        other._check_frame(tok)
        assert other.frame == "plain"
        for t in trials:
            assert other.render(t) == base_engine.render(t)
            assert other.option_ids(t) == base_engine.option_ids(t)


# ------------------------------------------------------------------ runs, reports, comparisons, the trial view
RUN = ["--items", "pond_child", "--forms", "acceptable", "--quiet"]


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    """A yes/no run on ``tiny-base`` under ``--frame auto`` (so in the plain frame), with its report."""
    from probe.app.cli import main

    out = tmp_path_factory.mktemp("frame") / "plain"
    assert main(["run", "yesno", "--model", "tiny-base", *RUN, "--out", str(out)]) == 0
    return out


def test_a_run_says_its_frame_in_the_manifest_and_the_report(plain_run):
    from probe.runs import open_run

    run = open_run(plain_run)
    assert run.manifest.engine.frame == "plain" and run.manifest.engine.frame_asked == "auto"
    identity = json.loads((plain_run / "manifest.json").read_text())["identity"]
    assert identity["frame"] == "plain"
    summary = (plain_run / "report" / "summary.md").read_text()
    assert "- prompt frame: plain (the model has no chat template, so --frame auto fell back to it)" in summary
    assert "- system prompt: none (--system was not given)" in summary


def test_frame_chat_on_a_model_without_a_template_writes_nothing(tmp_path, capsys):
    from probe.app.cli import main

    out = tmp_path / "chat"
    assert main(["run", "yesno", "--model", "tiny-base", "--frame", "chat", *RUN, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "use --frame plain" in err[0]
    assert not out.exists()


def test_compare_and_the_trial_view_show_the_frame(plain_run, tmp_path):
    from probe.app.cli import main
    from probe.app.prompts import Renderer
    from probe.runs import open_run

    chat = tmp_path / "chat"
    assert main(["run", "yesno", "--model", "tiny", *RUN, "--out", str(chat), "--no-report"]) == 0
    cmp = tmp_path / "cmp"
    assert main(["compare", str(chat), str(plain_run), "--out", str(cmp), "--quiet"]) == 0
    summary = (cmp / "summary.md").read_text()
    assert "| name | model | reasoning | frame | experiment | run |" in summary
    assert (
        "| tiny-base plain | tiny-base | off | plain | yesno |" in summary and "| tiny | tiny | off | chat |" in summary
    )
    run = open_run(plain_run)
    renderer = Renderer(run.manifest)
    row = next(run.readouts.itertuples())
    shown = renderer.render(run.trial(row.trial_id), row.prompt_tokens)
    assert shown.exact and "plain frame" in shown.source and shown.text.endswith("\n\nAnswer:")
    assert shown.text.startswith("Question: ") and shown.n_tokens == row.prompt_tokens


def test_a_follow_up_in_the_plain_frame_keeps_the_first_replys_ids(tmp_path):
    """Deterministic (draws seeded per trial and draw). The follow-up prompt is the first prompt, the sampled reply's
    ids, then ``\\n\\nQuestion: ...\\n\\nAnswer:``, read after those exact ids."""
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings
    from probe.app.cli import main
    from probe.store import RunStore

    src, fu = tmp_path / "src", tmp_path / "fu"
    triage = ["--factors", "gender", "--sizes", "1-2", "--influences", "survey", "--controls", "none"]
    args = ["run", "influence-triage", "--model", "tiny-base", *triage, "--samples", "2", "--quiet", "--no-report"]
    assert main([*args, "--out", str(src)]) == 0
    pick = ["--select", "no_effect,baseline,backfire,compliance", "--per-cell", "2", "--max-new-tokens", "8"]
    assert main(["run", "followup", "--model", "tiny-base", "--source", str(src), "--out", str(fu), "--quiet",
                 "--no-report", *pick]) == 0  # fmt: skip
    store = RunStore(fu)
    e = HFEngine(HFSettings(model="tiny-base")).load()
    checked = 0
    for t in store.trials():
        at = next(i for i, m in enumerate(t.messages) if m.reply_ids is not None)
        kept = t.messages[at]
        if not kept.reply_ids:
            continue
        first = render.render_ids(e.tokenizer, replace(t, messages=t.messages[:at]), think=False, frame="plain")
        ids = e.render(t)
        assert ids[: len(first)] == first and ids[len(first) : len(first) + len(kept.reply_ids)] == kept.reply_ids
        assert e.tokenizer.decode(list(ids[len(first) + len(kept.reply_ids) :])).startswith("\n\nQuestion: ")
        checked += 1
    assert checked
