"""LoRA adapters on a running engine, as control asks (`load_adapters`; docs/api.md, "LoRA adapters").

llama.cpp loads adapters at launch (`--lora`, each at scale 0): `sync_launched` reads which it lists at
`GET /lora-adapters` ({id, path}), and reports each listed adapter loaded with its id (a request names it by
id, llmgw/gateway/app.py); one its replica was started without is `loading` (control replaces the replica by
one started with it). vLLM's runtime API, which the sim engine speaks too: `POST /v1/load_lora_adapter {lora_name, lora_path}`,
`POST /v1/unload_lora_adapter {lora_name}`, and the loaded adapters listed in `GET /v1/models`. An adapter is
reported `loaded` only once the engine lists it: an engine that answered 200 to a load and does not list the
adapter (vLLM and AIBrix users saw a missing path "loaded") gets it reported `failed` with that said, so no
request is routed to it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping

import httpx
import trio

from llmgw.errors import describe

log = logging.getLogger("llmgw.agent.adapters")

LOADED = "loaded"
LOADING = "loading"
FAILED = "failed: "
LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"
LIST_PATH = "/v1/models"
MAX_WORDS = 300  # of an engine's refusal, in a report


async def sync_adapters(http: httpx.AsyncClient, url: str, wanted: Mapping[str, str], had: Mapping[str, str],
                        report: Callable[[dict[str, str]], None], timeout_s: float) -> None:
    """Make the engine at `url` hold exactly `wanted` (name -> file) of the adapters: `report` each one's state,
    first all `loading`, then loaded or failed. `had`: what this replica was asked for before (those no longer
    wanted are unloaded; an unload that fails is only logged: nothing routes to them any more)."""
    states = {name: LOADING for name in wanted}
    report(dict(states))
    try:
        listed = await _listed(http, url, timeout_s)
    except _Failed as e:
        report({name: FAILED + f"cannot read the engine's model list: {e}" for name in wanted})
        return
    for name in sorted(set(had) - set(wanted)):
        if name in listed:
            try:
                await _post(http, url + UNLOAD_PATH, {"lora_name": name}, timeout_s)
            except _Failed as e:
                log.warning("adapter %s: unloading it failed (%s); no request is routed to it", name, e)
    asked = []
    for name, source in sorted(wanted.items()):
        if name in listed:
            states[name] = LOADED  # already there (an adopted engine, a set sent again)
            continue
        try:
            await _post(http, url + LOAD_PATH, {"lora_name": name, "lora_path": source}, timeout_s)
            asked.append(name)
        except _Failed as e:
            states[name] = FAILED + f"the engine refused to load {source}: {e}"
    if asked:
        try:
            listed = await _listed(http, url, timeout_s)
        except _Failed as e:
            listed = set()
            log.warning("adapters %s: the engine's model list could not be read after the load: %s", asked, e)
        for name in asked:
            states[name] = LOADED if name in listed else (
                FAILED + "the engine answered the load with success but does not list the adapter among its models")
    for name, state in sorted(states.items()):
        if state != LOADED:
            log.warning("adapter %s: %s", name, state)
    report(states)


LORA_ADAPTERS_PATH = "/lora-adapters"  # llama.cpp's list of the adapters it loaded at launch


async def sync_launched(http: httpx.AsyncClient, url: str, wanted: Mapping[str, str],
                        report: Callable[[dict[str, str], dict[str, int], int], None], timeout_s: float,
                        launched: tuple[str, ...] | None, skipped: Mapping[str, str]) -> None:
    """llama.cpp: each wanted adapter (name -> file) reported loaded, with its id, once the engine lists its file;
    `loading` when this replica was started without it (`launched`: the files it was started with; None: not
    known, an adopted engine); failed with why otherwise (`skipped`: those its launch left out)."""
    try:
        with trio.fail_after(timeout_s):
            r = await http.get(url + LORA_ADAPTERS_PATH, timeout=timeout_s)
        if r.status_code != 200:
            raise _Failed(f"HTTP {r.status_code}")
        listed = {os.path.normpath(str(a["path"])): int(a["id"]) for a in r.json() if isinstance(a, dict)}
    except (trio.TooSlowError, httpx.HTTPError, OSError, ValueError, KeyError, TypeError, _Failed) as e:
        words = f"no answer within {timeout_s:g} s" if isinstance(e, trio.TooSlowError) else describe(e)
        report({name: FAILED + f"cannot read llama.cpp's {LORA_ADAPTERS_PATH}: {words}" for name in wanted}, {}, 0)
        return
    states: dict[str, str] = {}
    ids: dict[str, int] = {}
    for name, file in sorted(wanted.items()):
        if (found := listed.get(os.path.normpath(file))) is not None:
            states[name], ids[name] = LOADED, found
        elif file in skipped:
            states[name] = FAILED + f"left out of this replica's launch: {skipped[file]}"
        elif launched is not None and file not in launched:
            states[name] = LOADING  # started before the adapter was defined: a replica started with it comes
        else:
            states[name] = FAILED + "llama.cpp does not list it among the adapters it loaded at launch"
    for name, state in sorted(states.items()):
        if state.startswith(FAILED):
            log.warning("adapter %s: %s", name, state)
    report(states, ids, len(listed))


class _Failed(Exception):
    pass


async def _listed(http: httpx.AsyncClient, url: str, timeout_s: float) -> set[str]:
    """The model ids the engine lists (its own and its loaded adapters)."""
    try:
        with trio.fail_after(timeout_s):
            r = await http.get(url + LIST_PATH, timeout=timeout_s)
        if r.status_code != 200:
            raise _Failed(f"HTTP {r.status_code}")
        data = r.json().get("data", [])
        return {str(item.get("id")) for item in data if isinstance(item, dict)}
    except (trio.TooSlowError, httpx.HTTPError, OSError, ValueError, AttributeError) as e:
        raise _Failed(describe(e) if not isinstance(e, trio.TooSlowError) else f"no answer within {timeout_s:g} s")


async def _post(http: httpx.AsyncClient, url: str, body: dict[str, str], timeout_s: float) -> None:
    try:
        with trio.fail_after(timeout_s):
            r = await http.post(url, json=body, timeout=timeout_s)
    except trio.TooSlowError:
        raise _Failed(f"no answer within {timeout_s:g} s") from None
    except (httpx.HTTPError, OSError) as e:
        raise _Failed(describe(e)) from None
    if r.status_code == 404:
        raise _Failed("HTTP 404: this engine does not load adapters at run time (vLLM needs --enable-lora)")
    if r.status_code != 200:
        raise _Failed(f"HTTP {r.status_code}: {_words(r)}")


def _words(r: httpx.Response) -> str:
    try:
        doc = r.json()
        error = doc.get("error") if isinstance(doc, dict) else None
        text = error.get("message") if isinstance(error, dict) else (doc.get("message") if isinstance(doc, dict)
                                                                      else None)
        return str(text or r.text)[:MAX_WORDS]
    except ValueError:
        return r.text[:MAX_WORDS]
