"""``probe view RUN [RUN ...]``: a local web viewer of runs, their reports and every trial; here its pages.

A standard-library HTTP server (``ThreadingHTTPServer``) bound to 127.0.0.1
(:mod:`probe.app.viewserver`, with the command line), serving server-rendered HTML (Jinja2 templates, autoescaped) with one small
script and one style sheet from ``probe/app/static/``: no front-end build, no
CDN, nothing fetched from the network, and every page works without the
script (it only sorts and filters tables and submits the filter form when a
choice changes). Why: a researcher runs this on a laptop or a cluster login
node over an SSH tunnel, where a Node tool chain or a CDN is not at hand, and
the pages are tables and text.

Every page and its JSON twin under ``/api/`` are answered by
:meth:`Viewer.handle`, a function of (path, query) that the tests call
directly and through a real server. The runs are read through
:mod:`probe.runs` (the documented Python API): the trial browser pages the
trial index and the chunk tables on demand (:class:`probe.query.RunQuery`);
the browser is sent one page.

Safety: the server binds 127.0.0.1 only; it serves the run folders it was
given and its own static files, nothing else (a path with ``..``, an absolute
or an encoded one is refused); it never shows an environment variable, and
manifest fields that could hold a secret (API keys, tokens, headers) are
shown as ``[redacted]`` (:mod:`probe.app.redact`).
"""

from __future__ import annotations

import contextlib
import html
import json
import math
import mimetypes
import os
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probe.app import markdown
from probe.app.prompts import Renderer
from probe.app.redact import redact
from probe.app.trialview import side_by_side, view_of
from probe.errors import ProbeError
from probe.files import LinkError, inside, link_problem
from probe.query import FilterError, RunQuery, TrialFilter
from probe.runs import NotARunError, Run, factor_column, open_run, run_folders
from probe.store import json_ready
from probe.tables import SAMPLE_STATUSES
from probe.terminal import escape_controls

HERE = Path(__file__).resolve().parent
STATIC = HERE / "static"
TEMPLATES = HERE / "templates"
PAGE_SIZE = 50
MAX_PAGE = 500
ITEM_COLUMNS = ("item_id", "item", "dilemma", "story", "scenario")
"""Report columns whose values name items (a row there links to that item's trials)."""
# ------------------------------------------------------------------ responses
PAGE_CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
"""The policy of every page: only the viewer's own script and style sheet, and no framing by another site."""


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/html; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()
    csp: str = PAGE_CSP
    """The Content-Security-Policy it is sent with (report files: :data:`SANDBOX_CSP`)."""


def _json(obj: Any, status: int = 200) -> Response:
    """A JSON answer: strict JSON (NaN, infinities and NA written as null, never a bare ``NaN``)."""
    body = json.dumps(json_ready(obj), ensure_ascii=False, allow_nan=False)
    return Response(status, body.encode(), "application/json; charset=utf-8")


class NotFound(ProbeError, LookupError):
    """A page, run, trial or file the viewer does not have (HTTP 404)."""


class Refused(ProbeError, PermissionError):
    """A path outside the run folders (HTTP 403)."""


@dataclass(frozen=True)
class Route:
    pattern: re.Pattern[str]
    handler: Callable[..., Response]


# ------------------------------------------------------------------ the viewer
@dataclass
class Viewer:
    """The runs of one ``probe view`` and the pages about them."""

    runs: list[Run]
    renderers: list[Renderer] = field(default_factory=list)
    locks: list[threading.RLock] = field(default_factory=list)
    """One lock per run (its lazy caches are not thread-safe): a slow request (a tokenizer's first load) holds up
    the pages of its own run only, never the static files or another run."""
    queries: list[RunQuery] = field(default_factory=list)
    """One query engine per run (the trial browser's filters and pages)."""
    env: Any = None

    @classmethod
    def open(cls, paths: Sequence[str | os.PathLike[str]]) -> Viewer:
        """Open every run (a ``probe compare`` folder opens the runs of its panel); NotARunError for any other
        folder."""
        folders = [f for p in paths for f in run_folders(p)]
        if not folders:
            raise NotARunError("give at least one run folder (the --out of `probe run`)")
        runs = [open_run(f, allow_partial=True) for f in folders]
        return cls(runs, [Renderer(r.manifest) for r in runs])

    def __post_init__(self) -> None:
        import jinja2

        if not self.renderers:
            self.renderers = [Renderer(r.manifest) for r in self.runs]
        self.locks = [threading.RLock() for _ in self.runs]
        self.queries = [RunQuery(r) for r in self.runs]
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(TEMPLATES)),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters["num"] = _num_filter
        self.env.filters["query"] = _query
        self.env.filters["token"] = _token_filter
        self.env.filters["count"] = _count_filter
        self.routes = [
            Route(re.compile(r"^/$"), self.page_home),
            Route(re.compile(r"^/favicon\.ico$"), lambda query: Response(204, b"", "image/x-icon")),
            Route(re.compile(r"^/static/([A-Za-z0-9_.-]+)$"), self.static),
            Route(re.compile(r"^/r/(\d+)/$"), self.page_run),
            Route(re.compile(r"^/r/(\d+)/trials$"), self.page_trials),
            Route(re.compile(r"^/r/(\d+)/trial/([A-Za-z0-9_-]+)$"), self.page_trial),
            Route(re.compile(r"^/r/(\d+)/table/([A-Za-z0-9_.-]+)$"), self.page_table),
            Route(re.compile(r"^/r/(\d+)/report/([A-Za-z0-9_.-]+)$"), self.report_file),
            Route(re.compile(r"^/api/runs$"), self.api_runs),
            Route(re.compile(r"^/api/r/(\d+)/run$"), self.api_run),
            Route(re.compile(r"^/api/r/(\d+)/levels$"), self.api_levels),
            Route(re.compile(r"^/api/r/(\d+)/trials$"), self.api_trials),
            Route(re.compile(r"^/api/r/(\d+)/trial/([A-Za-z0-9_-]+)$"), self.api_trial),
        ]

    def warm(self, log: Callable[[str], None] = print) -> None:
        """Build (or load) every run's trial index and check its chunks, so the first page is fast."""
        for run in self.runs:
            t0 = time.perf_counter()
            run.index()
            integrity = run.integrity
            line = f"{run.root}: {run.n_trials:,} trials, {integrity.counts_line()} ({time.perf_counter() - t0:.1f} s)"
            log(escape_controls(line))

    # ------------------------------------------------------------ dispatch
    def handle(self, target: str) -> Response:
        """The response to ``GET target`` (path and query)."""
        parts = urllib.parse.urlsplit(target)
        raw = parts.path
        path = urllib.parse.unquote(raw)
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        wants_json = path.startswith("/api/")
        try:
            if _outside(raw) or _outside(path):
                raise Refused(f"refused {path!r}: the viewer serves the run folders it was given, nothing outside them")
            for route in self.routes:
                m = route.pattern.match(path)
                if m:
                    with self._lock(path), self._snapshot(path):
                        return route.handler(*m.groups(), query=query)
            raise NotFound(f"no page {path!r}; start at /")
        except (Refused, LinkError) as e:
            return self._error(403, str(e), wants_json)
        except (NotFound, KeyError) as e:
            return self._error(404, str(e.args[0]) if e.args else "not found", wants_json)
        except (FilterError, ProbeError, ValueError) as e:
            return self._error(400, str(e), wants_json)
        except Exception as e:  # a bug: say so on the page, keep serving
            sys.stderr.write(escape_controls(f"probe view: error on {path!r}: {type(e).__name__}: {e}") + "\n")
            return self._error(500, f"internal error ({type(e).__name__}: {e}); please report it", wants_json)

    def _lock(self, path: str) -> contextlib.AbstractContextManager[Any]:
        """The lock of the run a path is about; a trial's page with several runs open reads every run (side by
        side), so it takes every lock, in one order. Pages listing every run take each run's lock in turn."""
        m = re.match(r"^(?:/api)?/r/(\d+)/(trial/)?", path)
        k = int(m.group(1)) if m else -1
        if not 0 <= k < len(self.locks):
            return contextlib.nullcontext()
        if m is not None and m.group(2) and len(self.locks) > 1:
            stack = contextlib.ExitStack()
            for lock in self.locks:
                stack.enter_context(lock)
            return stack
        return self.locks[k]

    def _snapshot(self, path: str) -> contextlib.AbstractContextManager[None]:
        """The run a path is about checks its chunks once for the whole request."""
        m = re.match(r"^(?:/api)?/r/(\d+)/", path)
        k = int(m.group(1)) if m else -1
        return self.queries[k].snapshot() if 0 <= k < len(self.queries) else contextlib.nullcontext()

    def _error(self, status: int, message: str, wants_json: bool) -> Response:
        if wants_json:
            return _json({"error": message, "status": status}, status)
        return Response(status, self._render("error.html", status=status, message=message, run_index=None).body)

    def _render(self, template: str, **ctx: Any) -> Response:
        base = {"runs": [(i, r.name) for i, r in enumerate(self.runs)]}
        return Response(200, self.env.get_template(template).render(**base, **ctx).encode())

    def _run(self, i: str) -> tuple[int, Run]:
        k = int(i)
        if not 0 <= k < len(self.runs):
            raise NotFound(f"no run {k}; this viewer has runs 0-{len(self.runs) - 1}")
        return k, self.runs[k]

    # ------------------------------------------------------------ files
    def static(self, name: str, query: Any) -> Response:
        path = STATIC / name
        if name.startswith(".") or not path.is_file() or path.resolve().parent != STATIC:
            raise NotFound(f"no static file {name!r}")
        return _file(path)

    def report_file(self, i: str, name: str, query: Any) -> Response:
        _, run = self._run(i)
        return _report_file(_report_path(run, name))

    # ------------------------------------------------------------ run data
    def run_info(self, k: int) -> dict[str, Any]:
        with self.locks[k]:
            return self._run_info(k)

    def _run_info(self, k: int) -> dict[str, Any]:
        run = self.runs[k]
        integrity = self.queries[k].integrity
        rec = run.manifest
        files, refused = _report_listing(run)
        return {
            "writing": _writer(run),
            "index": k,
            "name": run.name,
            "path": str(run.root),
            "experiment": run.experiment,
            "model": run.model,
            "engine": redact(rec.engine.kind or None),
            "created": redact(rec.created),
            "project_commit": redact(rec.project_commit),
            "run_key": redact(rec.run_key or None),
            "n_trials": run.n_trials,
            "integrity": {
                "complete": integrity.complete,
                "line": integrity.counts_line(),
                "chunks": len(integrity.chunks),
                "verified": len(integrity.verified),
                "damaged": [
                    {"chunk": c.chunk, "trials": list(c.trials), "reason": c.reason} for c in integrity.damaged
                ],
                "missing": len(integrity.missing),
                "found_trials": integrity.found_trials,
            },
            "report": {
                "refused": refused,
                "summary": "summary.md" in files,
                "tables": [f for f in files if f.endswith(".csv")],
                "figures": [f for f in files if f.endswith(".png")],
            },
            "manifest": redact(rec),
        }

    def levels(self, k: int) -> dict[str, list[str]]:
        return {name: list(v) for name, v in self.queries[k].levels.items()}

    def cell_link(self, k: int) -> markdown.CellFn:
        """(header, value) -> the trials URL of a report cell that names an item or a factor level."""
        items = set(self.queries[k].levels["item"])

        def link(header: str, value: str) -> str | None:
            value = value.strip().strip("`")
            if header.strip().lower() in ITEM_COLUMNS and value in items:
                return f"/r/{k}/trials?" + _query([("item", value)])
            return None

        return link

    def row_filter(self, k: int, header: Sequence[str], row: Sequence[str]) -> list[tuple[str, str]]:
        """The filter of the trials behind one report row: its item and the factor levels it names."""
        run = self.runs[k]
        lv = self.queries[k].levels
        pairs: list[tuple[str, str]] = []
        for h, v in zip(header, row, strict=False):
            h, v = h.strip(), str(v).strip()
            if h.lower() in ITEM_COLUMNS and v in lv["item"] and not any(p[0] == "item" for p in pairs):
                pairs.append(("item", v))
            elif h in run.factor_names and v in lv[h]:
                pairs.append((factor_column(h), v))
        return pairs

    # ------------------------------------------------------------ pages
    def page_home(self, query: Any) -> Response:
        if len(self.runs) == 1:
            return Response(302, b"", headers=(("Location", "/r/0/"),))
        return self._render("home.html", infos=[self.run_info(k) for k in range(len(self.runs))], run_index=None)

    def page_run(self, i: str, query: Any) -> Response:
        k, run = self._run(i)
        info = self.run_info(k)
        summary = ""
        if info["report"]["summary"]:
            path = _report_path(run, "summary.md")
            summary = markdown.render(
                path.read_text(encoding="utf-8", errors="replace"),
                link=lambda u: _report_url(k, u),
                cell=self.cell_link(k),
            )
        manifest_json = json.dumps(json_ready(info["manifest"]), indent=2, sort_keys=True, allow_nan=False)
        return self._render("run.html", run_index=k, info=info, summary=summary, manifest_json=manifest_json)

    def page_table(self, i: str, name: str, query: Any) -> Response:
        import csv
        import io

        k, run = self._run(i)
        path = _report_path(run, name)
        if path.suffix != ".csv":
            raise NotFound(f"{name} is not a report table (CSV)")
        rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8", errors="replace"))))
        header, body = (rows[0], rows[1:]) if rows else ([], [])
        links = [self.row_filter(k, header, r) for r in body]
        return self._render(
            "table.html",
            run_index=k,
            info=self.run_info(k),
            name=name,
            header=header,
            rows=list(zip(body, links, strict=True)),
        )

    def trials_context(self, k: int, query: Sequence[tuple[str, str]]) -> dict[str, Any]:
        offset, limit, pairs = _paging(query)
        flt = TrialFilter.parse(pairs)
        page = self.queries[k].page(flt, offset, limit)
        rows = json_ready(page.rows.to_dict("records")) if len(page.rows) else []  # NaN / NA -> None
        return {"filter": flt.pairs(), "total": page.total, "offset": offset, "limit": limit, "rows": rows}

    def page_trials(self, i: str, query: Any) -> Response:
        k, run = self._run(i)
        error = None
        try:
            ctx = self.trials_context(k, query)
        except FilterError as e:
            error = str(e)
            pairs = [(a, b) for a, b in query if a not in ("offset", "limit")]
            ctx = {"filter": pairs, "total": 0, "offset": 0, "limit": PAGE_SIZE, "rows": []}
        selected: dict[str, list[str]] = {}
        for a, b in ctx["filter"]:
            selected.setdefault(a, []).append(b)
        resp = self._render(
            "trials.html",
            run_index=k,
            info=self.run_info(k),
            levels=self.levels(k),
            factor_names=[(factor_column(n), n) for n in run.factor_names],
            statuses=SAMPLE_STATUSES,
            selected=selected,
            error=error,
            **ctx,
        )
        return Response(400, resp.body) if error else resp

    def trial_context(self, k: int, trial_id: str) -> dict[str, Any]:
        run = self.runs[k]
        try:
            view = view_of(run, self.queries[k].trial_data(trial_id), self.renderers[k])
        except KeyError:
            raise NotFound(f"run {run.name} has no trial {trial_id!r}") from None
        others = side_by_side(self.runs, view, k) if len(self.runs) > 1 else []
        return {"trial": view, "others": others}

    def page_trial(self, i: str, trial_id: str, query: Any) -> Response:
        k, _ = self._run(i)
        ctx = self.trial_context(k, trial_id)
        back = [(factor_column(n), str(v)) for n, v in ctx["trial"]["factors"].items()]
        return self._render(
            "trial.html",
            run_index=k,
            info=self.run_info(k),
            back=[("item", ctx["trial"]["item_id"])],
            same_form=back,
            **ctx,
        )

    # ------------------------------------------------------------ JSON
    def api_runs(self, query: Any) -> Response:
        infos = [self.run_info(k) for k in range(len(self.runs))]
        return _json({"runs": [{key: v for key, v in info.items() if key != "manifest"} for info in infos]})

    def api_run(self, i: str, query: Any) -> Response:
        k, _ = self._run(i)
        return _json(self.run_info(k))

    def api_levels(self, i: str, query: Any) -> Response:
        k, run = self._run(i)
        return _json({"levels": self.levels(k), "statuses": list(SAMPLE_STATUSES), "factors": list(run.factor_names)})

    def api_trials(self, i: str, query: Any) -> Response:
        k, _ = self._run(i)
        return _json(self.trials_context(k, query))

    def api_trial(self, i: str, trial_id: str, query: Any) -> Response:
        k, _ = self._run(i)
        return _json(self.trial_context(k, trial_id))


# ------------------------------------------------------------------ helpers
def _outside(path: str) -> bool:
    """A path that points outside what the viewer serves: ``..`` segments, backslashes, NUL, or ``//``."""
    segs = path.split("/")
    return ".." in segs or "\\" in path or "\x00" in path or "//" in path or any(s.startswith("~") for s in segs)


def _report_path(run: Run, name: str) -> Path:
    """The report file ``name`` of ``run``: a plain name, no symbolic link on the way (the report folder or the
    file), a regular file, and resolved inside the resolved run folder."""
    if name.startswith(".") or "/" in name:
        raise Refused(f"refused {name!r}: only files of the run's report folder are served")
    try:
        path = inside(run.root, "report", name)
    except LinkError as e:
        raise Refused(f"refused {name!r}: {e}") from None
    if not path.is_file():
        raise NotFound(f"run {run.name} has no report file {name!r}")
    if not path.resolve().is_relative_to(run.root.resolve()):
        raise Refused(f"refused {name!r}: it lies outside the run folder")
    return path


def _writer(run: Run) -> str | None:
    """Who is writing the run now (a ``probe run`` holding its lock), or None."""
    from probe.lock import LOCK_FILE, RunLock

    if link_problem(run.root / LOCK_FILE):
        return None
    lock = RunLock(run.root)
    if not lock.peek():
        return None
    holder = lock.holder()
    return holder.describe() if holder else "a process that has not written its name yet"


def _report_listing(run: Run) -> tuple[list[str], str]:
    """(the report files the viewer shows, why some or all are not shown): symbolic links are left out."""
    try:
        report = inside(run.root, "report")
    except LinkError:
        return [], "the report folder is a symbolic link; it is not shown (it could show files from outside the run)"
    if not report.is_dir():
        return [], ""
    shown, links = [], []
    for p in sorted(report.iterdir(), key=lambda p: p.name):
        if p.name.startswith("."):
            continue
        if link_problem(p):
            links.append(p.name)
        elif p.is_file():
            shown.append(p.name)
    why = (
        f"{len(links)} file(s) of the report are symbolic links (or not regular files) and not shown: {', '.join(links[:10])}"
        if links
        else ""
    )
    return shown, why


def _report_url(k: int, url: str) -> str | None:
    """A report's relative link, pointed at its file in the run's report folder (None: not a report file)."""
    name = url.split("#", 1)[0].split("?", 1)[0]
    if "/" in name or name.startswith(".") or not name:
        return None
    return f"/r/{k}/report/{urllib.parse.quote(name)}"


def _file(path: Path) -> Response:
    """One of the viewer's own static files (its script and style sheet)."""
    ctype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    if ctype.startswith("text/") or ctype in ("application/javascript", "text/javascript"):
        ctype += "; charset=utf-8"
    return Response(200, path.read_bytes(), ctype, (("Cache-Control", "no-cache"),))


REPORT_TYPES: dict[str, str] = {
    ".png": "image/png",
    ".csv": "text/plain; charset=utf-8",
    ".md": "text/plain; charset=utf-8",
    ".json": "text/plain; charset=utf-8",
}
"""The report files the viewer shows in the browser, and the type it gives them. CSV, Markdown and JSON go as
plain text: a browser renders nothing in them. Every other file (HTML, SVG, JavaScript, ...) could carry script
that would run in the viewer's origin and read its API, so it is sent as a download."""
SANDBOX_CSP = "sandbox; default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; frame-ancestors 'none'"
"""The policy of every report file: a sandboxed, opaque origin that runs no script, even if a browser renders it."""


def _report_file(path: Path) -> Response:
    """A report file: a type from :data:`REPORT_TYPES`, else a download; always under :data:`SANDBOX_CSP`."""
    body = path.read_bytes()
    ctype = REPORT_TYPES.get(path.suffix.lower())
    if ctype is not None:
        return Response(200, body, ctype, (("Cache-Control", "no-cache"),), csp=SANDBOX_CSP)
    disposition = f"attachment; filename*=UTF-8''{urllib.parse.quote(path.name)}"
    return Response(
        200,
        body,
        "application/octet-stream",
        (("Cache-Control", "no-cache"), ("Content-Disposition", disposition)),
        csp=SANDBOX_CSP,
    )


def _paging(query: Sequence[tuple[str, str]]) -> tuple[int, int, list[tuple[str, str]]]:
    offset, limit, pairs = 0, PAGE_SIZE, []
    for key, value in query:
        if key in ("offset", "limit"):
            try:
                n = int(value)
            except ValueError:
                raise FilterError(f"{key} must be a whole number, got {value!r}") from None
            if key == "offset":
                offset = max(n, 0)
            else:
                limit = min(max(n, 1), MAX_PAGE)
        else:
            pairs.append((key, value))
    return offset, limit, pairs


def _query(pairs: Any, **more: Any) -> str:
    items = list(pairs) + [(k, str(v)) for k, v in more.items() if v is not None]
    return urllib.parse.urlencode(items)


def _token_filter(token: Any) -> str:
    """A token as a quoted string that shows its whitespace (``"\\n"``) but keeps ``<|im_end|>`` readable (Jinja's
    ``tojson`` wrote ``\\u003c|im_end|\\u003e``); the page escapes it as HTML."""
    return json.dumps(str(token), ensure_ascii=False)


def _count_filter(n: Any, word: str) -> str:
    """``1 token``, ``2 tokens``."""
    if n is None:
        return f"- {word}s"
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _num_filter(x: Any, spec: str = ".4f") -> str:
    if x is None:
        return "-"
    try:
        f = float(x)
    except (TypeError, ValueError):
        return html.escape(str(x))
    return "-" if math.isnan(f) else format(f, spec)
