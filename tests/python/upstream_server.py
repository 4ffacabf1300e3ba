"""A small upstream MCP server for the gateway tests, written with the official Python SDK
(`mcp` 2.x, tests/python/requirements.txt). countersign's MCP gateway launches it over stdio
and proxies calls to it.

Run it as `python upstream_server.py` (stdio), or `python upstream_server.py --http PORT`
(Streamable HTTP at http://127.0.0.1:PORT/mcp), with the environment variable UPSTREAM_DIR
naming the directory that holds the notes (created if it is missing). It serves:

- tool `read_note(name)`, annotated readOnlyHint=true: the text of the file UPSTREAM_DIR/NAME,
  or "(none)" if there is no such file.
- tool `write_note(name, text)`, annotated readOnlyHint=false, destructiveHint=true: writes
  UPSTREAM_DIR/NAME, then appends the line "write_note NAME" to UPSTREAM_DIR/calls.log. Both
  writes are fsynced, so a test can count how many times the tool really ran, even after
  killing the server.
- tool `slow_write(name, text, seconds)`, annotated like write_note: sleeps SECONDS, then
  writes like write_note and logs "slow_write NAME". Use it for tests that kill a call in
  flight: if the server dies during the sleep, neither the note nor the log line appears.
- resource `note://list`: the names of the notes, one per line (calls.log left out).
- prompt `summarize(name)`: a user message asking for a summary of the note NAME.

A note name must be a plain file name: not empty, no "/" or "\\", not starting with ".", and
not "calls.log". Any other name makes the tool return an error result (isError) that names it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

CALLS_LOG = "calls.log"

server = MCPServer("upstream-test", log_level="WARNING")


def notes_dir() -> Path:
    value = os.environ.get("UPSTREAM_DIR")
    if not value:
        raise RuntimeError("UPSTREAM_DIR is not set")
    path = Path(value)
    path.mkdir(parents=True, exist_ok=True)
    return path


def note_path(name: str) -> Path:
    if not name or "/" in name or "\\" in name or name.startswith(".") or name == CALLS_LOG or "\0" in name:
        raise ToolError(f"invalid note name: {name!r}")
    return notes_dir() / name


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_and_log(name: str, text: str, tool: str) -> str:
    path = note_path(name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    with open(notes_dir() / CALLS_LOG, "a", encoding="utf-8") as log:
        log.write(f"{tool} {name}\n")
        log.flush()
        os.fsync(log.fileno())
    fsync_dir(notes_dir())
    return f"wrote {name} ({len(text)} characters)"


@server.tool(
    description="Read a note. Returns its text, or (none) if there is no such note.",
    annotations=ToolAnnotations(read_only_hint=True),
)
def read_note(name: str) -> str:
    path = note_path(name)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return "(none)"


@server.tool(
    description="Write (create or replace) a note.",
    annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True),
)
def write_note(name: str, text: str) -> str:
    return write_and_log(name, text, "write_note")


@server.tool(
    description="Wait the given number of seconds, then write a note like write_note.",
    annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True),
)
async def slow_write(name: str, text: str, seconds: float) -> str:
    note_path(name)  # reject a bad name before sleeping
    await anyio.sleep(max(0.0, seconds))
    return write_and_log(name, text, "slow_write")


@server.resource("note://list", name="notes", description="The names of the notes, one per line.", mime_type="text/plain")
def list_notes() -> str:
    names = sorted(
        p.name for p in notes_dir().iterdir() if p.is_file() and p.name != CALLS_LOG and not p.name.startswith(".")
    )
    return "\n".join(names)


@server.prompt(description="Ask for a summary of a note.")
def summarize(name: str) -> str:
    try:
        text = note_path(name).read_text(encoding="utf-8")
    except FileNotFoundError:
        text = "(none)"
    return f"Summarize the note {name!r} in one sentence:\n\n{text}"


if __name__ == "__main__":
    notes_dir()  # fail at start, not on the first call, when UPSTREAM_DIR is missing
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
