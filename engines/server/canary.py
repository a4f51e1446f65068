"""The canary of a readout through a server (:mod:`engines.server`): one request per readout mode on a fixed
prompt, checked for what a working server must return, refusing one that returns nothing usable; what it found
(the modes offered, the mode used, the server's ``/version``, the URL without credentials) goes into the manifest.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from engines.api.transport import Transport
from engines.server.replies import (
    NoLogprobs,
    ServerRefused,
    ServerReply,
    check_prompt_count,
    check_values,
    parse_completion,
    public_url,
)
from engines.server.requests import completion_body
from engines.server.settings import EXACT_MODES, MODES, ServerSettings

CANARY_PROMPT = "Is water wet? Answer with Yes or No."
CANARY_OPTIONS = ("Yes", "No")


class Canary:
    """Asks the server once what it returns (:meth:`run`), through the engine's transport; ``reverse_for`` gives the
    text -> id map a reply needs where it names its top-k tokens by text."""

    def __init__(
        self,
        settings: ServerSettings,
        transport: Transport,
        reverse_for: Callable[[Any], Mapping[str, int] | None],
    ) -> None:
        self.settings = settings
        self.transport = transport
        self._reverse_for = reverse_for

    def run(self, ids: tuple[int, ...], yes: int, no: int) -> dict[str, Any]:
        """Find out once what the server returns on the canary prompt ``ids`` (options ``yes`` and ``no``, one token
        each), refusing one that returns nothing usable (see :mod:`engines.server`)."""
        s = self.settings
        found: dict[str, Any] = {"url": public_url(s.base_url), "version": self._version(), "prompt_tokens": len(ids)}
        offered: dict[str, bool] = {}
        reasons: dict[str, str] = {}
        # top-k first: it is the reference the other modes are checked against
        k = min(s.top_logprobs, 5)
        top = self._send("top_logprobs", completion_body(s.model, ids, logprobs=k), len(ids), reasons)
        if top is not None:
            ranked = [v for _, v in sorted(((-lp, t), lp) for t, lp in top.slot.items())]
            check_values("the canary's top-k", ranked)
            if top.ranked and top.slot[top.ranked[0]] < max(top.slot.values()) - 1e-6:
                raise ServerRefused(
                    f"the server's greedy token {top.ranked[0]} is not its most likely one (canary top-k "
                    f"{dict(list(top.slot.items())[:5])}); its log probabilities are not the model's"
                )
            if math.fsum(math.exp(v) for v in top.slot.values()) > 1 + 1e-4:
                raise ServerRefused(f"the server's canary top-k sums to more than probability 1 ({ranked[:6]})")
            offered["top_logprobs"] = True
        body = completion_body(s.model, ids, logprobs=1, logprob_token_ids=[yes, no])
        tid = self._send("token_ids", body, len(ids), reasons)
        if tid is not None and {yes, no} <= set(tid.slot):
            check_values("the canary's requested tokens", [tid.slot[yes], tid.slot[no]], varied=False)
            self._agree(top, tid.slot, "logprob_token_ids")
            offered["token_ids"] = True
        elif tid is not None:
            reasons["token_ids"] = "the requested token ids did not come back"
        body = completion_body(s.model, [*ids, yes], prompt_logprobs=1)
        pl = self._send("prompt_logprobs", body, len(ids) + 1, reasons, start=1)
        if pl is not None and len(pl.prompt) == len(ids) and yes in pl.prompt[-1]:
            check_values("the canary's prompt tokens", [lp for p in pl.prompt for lp in p.values()])
            self._agree(top, pl.prompt[-1], "prompt_logprobs")
            offered["prompt_logprobs"] = True
        elif pl is not None:
            reasons["prompt_logprobs"] = "no prompt_logprobs came back for every prompt token"
        found["offered"] = {m: bool(offered.get(m)) for m in MODES[1:]}
        found["why_not"] = {m: r for m, r in reasons.items() if not offered.get(m)}
        want = s.readout_mode
        if want == "auto":
            mode = next((m for m in MODES[1:] if offered.get(m)), None)
        else:
            mode = want if offered.get(want) else None
        if mode is None:
            what = "; ".join(f"{m}: {r}" for m, r in found["why_not"].items()) or "none returned"
            cls = NoLogprobs if not offered else ServerRefused
            asked = "any log probabilities" if want == "auto" else f"--server-readout {want}"
            raise cls(f"the server at {found['url']} does not return {asked} ({what})")
        found["mode"] = mode
        found["exact"] = mode in EXACT_MODES
        return found

    def _agree(self, top: ServerReply | None, other: Mapping[int, float], how: str) -> None:
        """The same token's log probability at the canary's slot must agree between the top-k and ``how``."""
        if top is None:
            return
        for t in [t for t in other if t in top.slot]:
            if abs(other[t] - top.slot[t]) > 1e-4:
                raise ServerRefused(
                    f"the server's {how} gives token {t} log probability {other[t]:.6g} at the canary's slot, "
                    f"its top-k {top.slot[t]:.6g}: one of them is not the model's"
                )

    def _send(
        self, mode: str, body: dict[str, Any], sent: int, reasons: dict[str, str], *, start: int = 0
    ) -> ServerReply | None:
        """One canary request; None (with the reason) where the server rejects the mode's parameters."""
        from engines.api.providers import ApiRequestError

        try:
            raw = self.transport.guard(lambda: self.transport.completion(body))
        except ApiRequestError as e:
            reasons[mode] = str(e).split(";")[0]
            return None
        reply = parse_completion(raw, start=start, reverse=self._reverse_for(raw))
        check_prompt_count(sent, reply, "the canary prompt")
        if mode != "prompt_logprobs" and not reply.slot:
            reasons[mode] = "the reply carries no log probabilities"
            return None
        return reply

    def _version(self) -> str | None:
        """The server's ``/version`` (vLLM), where it answers one."""
        import urllib.request

        url = (self.settings.base_url or "").rstrip("/")
        origin = url[: -len("/v1")] if url.endswith("/v1") else url
        try:
            with urllib.request.urlopen(origin + "/version", timeout=min(self.settings.timeout, 10.0)) as r:
                v = json.loads(r.read().decode()).get("version")
                return str(v) if v is not None else None
        except Exception:  # best effort: not every server has it
            return None
