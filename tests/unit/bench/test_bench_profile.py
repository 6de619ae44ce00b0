"""The profile summary (bench/profile.py): py-spy's collapsed stacks grouped by function and by
module group, self (the sampled frame) and inclusive (anywhere on the stack, once per stack)."""

from __future__ import annotations

from pathlib import Path

from bench.profile import group_of, main, merge, render, summary

STACKS = (
    "<module> (ungater/__main__.py:6);Reflector.run (ungater/_kube/reflector.py:211);"
    "loads (json/__init__.py:346);JSONDecoder.decode (json/decoder.py:337) 3\n"
    "<module> (ungater/__main__.py:6);Reflector.run (ungater/_kube/reflector.py:212);"
    "Reflector.apply (ungater/_kube/reflector.py:160);"
    "Reflector.apply (ungater/_kube/reflector.py:161) 2\n"
    "<module> (ungater/__main__.py:6);select (selectors.py:468) 5\n"
    "<module> (ungater/__main__.py:6);TaskHandle._run_coro (anyio/_core/_tasks.py:327);"
    "Patcher.release_all.<locals>.sender (ungater/_controller/patcher.py:110);"
    "ApiClientKube._request (ungater/_kube/adapter.py:45) 4\n"
    "not a sample line\n"
)


def test_frames_fall_into_their_module_groups() -> None:
    assert group_of("ungater/_kube/adapter.py") == "ungater._kube"
    assert group_of("json/decoder.py") == "json"
    assert group_of("/usr/lib/python3.11/json/decoder.py") == "json"
    assert group_of("yarl/_url.py") == "aiohttp/yarl/multidict"
    assert group_of("selectors.py") == "waiting (selectors, threading)"
    assert group_of("<frozen runpy>") == "other"


def test_self_counts_the_sampled_frame_and_inclusive_each_function_once(tmp_path: Path) -> None:
    path = tmp_path / "p.txt"
    path.write_text(STACKS)
    s = summary(path)
    assert s.total == 14
    assert s.self_fn["JSONDecoder.decode (json/decoder.py)"] == 3
    assert s.self_fn["Reflector.apply (ungater/_kube/reflector.py)"] == 2
    # lines merged, and a recursive frame counted once per stack
    assert s.incl_fn["Reflector.apply (ungater/_kube/reflector.py)"] == 2
    assert s.incl_fn["Reflector.run (ungater/_kube/reflector.py)"] == 5
    assert s.self_group == {"json": 3, "ungater._kube": 6, "waiting (selectors, threading)": 5}
    assert s.incl_group["ungater._kube"] == 9
    assert s.incl_group["ungater (other)"] == 14
    # what the loop ran: the frame under the task runner, else waiting or other
    assert s.by_task == {
        "Patcher.release_all.<locals>.sender (ungater/_controller/patcher.py)": 4,
        "(waiting)": 5,
        "(other)": 5,
    }


def test_render_puts_profiles_side_by_side(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(STACKS)
    merge([a, a], b)  # the windows summed: every count doubled
    text = render({"ctl": summary(a), "raw": summary(b)}, rows=2)
    assert "| group | ctl self | ctl incl. | raw self | raw incl. |" in text
    assert "| json |  21.4% |  21.4% |  21.4% |  21.4% |" in text
    assert "| (samples) | 14 |  | 28 |  |" in text
    assert "`<module> (ungater/__main__.py)`" not in text.split("by inclusive")[1]  # a root
    assert "raw, top functions by what the loop ran (task or callback):" in text
    assert main([f"ctl={a}", str(b)]) == 0
