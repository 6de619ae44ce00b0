"""The plugin registry and the typed facade over one plugin's hooks, with small fake plugins."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest

from tests.unit.builders import pod_view
from ungater._model.views import Kind, ObjectRef
from ungater._plugins.registry import KindHandler, PluginError, PluginInfo, PluginRegistry
from ungater.plugin_api import KindSpec, ReleaseGroup, hookimpl

WIDGET = Kind("example.com", "Widget")
GADGET = Kind("example.com", "Gadget")
WIDGET_SPEC = KindSpec("example.com", "Widget", pod_label="example.com/widget-uid")
GADGET_SPEC = KindSpec("example.com", "Gadget", pod_label="example.com/gadget-uid")
OWNER = ObjectRef("example.com/v1", "Widget", "w1", "owner-uid", True)
POD = pod_view("p0")


class FakePlugin:
    """A plain object holding hook functions as attributes (pluggy needs it hashable, which
    rules out types.SimpleNamespace)."""

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


def plugin(kinds: Any = (WIDGET_SPEC,), **hooks: Callable[..., Any]) -> FakePlugin:
    """A fake plugin: ``ungater_kinds`` returning ``kinds`` (or raising, if it is an exception)
    plus the given hooks, keyed by their name without the ``ungater_`` prefix."""

    @hookimpl
    def ungater_kinds() -> Any:
        if isinstance(kinds, BaseException):
            raise kinds
        return kinds

    ns: dict[str, Any] = {"ungater_kinds": ungater_kinds}
    for name, fn in hooks.items():
        ns[f"ungater_{name}"] = hookimpl(fn)
    return FakePlugin(**ns)


def good_hooks(tag: str = "good", calls: list[str] | None = None) -> dict[str, Callable[..., Any]]:
    def note(hook: str) -> None:
        if calls is not None:
            calls.append(f"{tag}.{hook}")

    def pod_selector(owner: ObjectRef) -> dict[str, str]:
        note("pod_selector")
        return {"example.com/widget-uid": owner.uid}

    def owns_pod(owner: ObjectRef, pod: Any, chain: Any) -> bool:
        note("owns_pod")
        return bool(chain) and chain[-1].uid == owner.uid

    def pod_set(owner: ObjectRef, pod: Any) -> str | None:
        note("pod_set")
        return f"{tag}-set"

    def sort_key(owner: ObjectRef, pod: Any) -> tuple[int | str, ...]:
        note("sort_key")
        return (1, pod.name)

    def release_group(owner: ObjectRef, pod: Any) -> ReleaseGroup | None:
        note("release_group")
        return ReleaseGroup(f"{tag}-g", 2)

    return {
        "pod_selector": pod_selector,
        "owns_pod": owns_pod,
        "pod_set": pod_set,
        "sort_key": sort_key,
        "release_group": release_group,
    }


def _exercise(h: KindHandler) -> tuple[Any, ...]:
    return (
        h.pod_selector(OWNER),
        h.owns_pod(OWNER, POD, [OWNER]),
        h.pod_set(OWNER, POD),
        h.sort_key(OWNER, POD),
        h.release_group(OWNER, POD),
    )


# -- choosing the provider ------------------------------------------------------------------------


def test_handler_picks_the_only_provider() -> None:
    reg = PluginRegistry.from_modules(
        {"widgets": plugin(**good_hooks()), "gadgets": plugin((GADGET_SPEC,))}
    )
    h = reg.handler(WIDGET)
    assert h.plugin.name == "widgets" and h.kind == WIDGET and h.spec == WIDGET_SPEC
    assert _exercise(h) == (
        {"example.com/widget-uid": "owner-uid"},
        True,
        "good-set",
        (1, "p0"),
        ReleaseGroup("good-g", 2),
    )
    assert reg.failures == []
    assert set(reg.all_kinds()) == {WIDGET, GADGET}
    assert [p.name for p in reg.providers(GADGET)] == ["gadgets"]


def test_no_provider() -> None:
    reg = PluginRegistry.from_modules({"gadgets": plugin((GADGET_SPEC,))})
    with pytest.raises(LookupError, match=r"no plugin serves kind Widget\.example\.com"):
        reg.handler(WIDGET)
    with pytest.raises(LookupError):
        PluginRegistry.from_modules({}).handler(WIDGET)


def test_two_providers_need_a_name() -> None:
    calls: list[str] = []
    reg = PluginRegistry.from_modules(
        {
            "alpha": plugin(**good_hooks("alpha", calls)),
            "beta": plugin(**good_hooks("beta", calls)),
        }
    )
    with pytest.raises(LookupError, match="served by several plugins") as info:
        reg.handler(WIDGET)
    assert "alpha" in str(info.value) and "beta" in str(info.value)
    for name in ("alpha", "beta"):
        calls.clear()
        h = reg.handler(WIDGET, plugin=name)
        assert h.plugin.name == name
        assert h.pod_set(OWNER, POD) == f"{name}-set"
        assert h.release_group(OWNER, POD) == ReleaseGroup(f"{name}-g", 2)
        _exercise(h)
        assert calls and all(c.startswith(f"{name}.") for c in calls), calls


def test_named_plugin_must_serve_the_kind() -> None:
    reg = PluginRegistry.from_modules(
        {"widgets": plugin(**good_hooks()), "gadgets": plugin((GADGET_SPEC,))}
    )
    with pytest.raises(LookupError, match="'gadgets' does not serve kind Widget"):
        reg.handler(WIDGET, plugin="gadgets")
    with pytest.raises(LookupError, match="'nope'"):
        reg.handler(WIDGET, plugin="nope")


def test_plugin_serving_two_kinds_gets_the_right_spec() -> None:
    reg = PluginRegistry.from_modules({"both": plugin((WIDGET_SPEC, GADGET_SPEC))})
    assert reg.handler(GADGET).spec == GADGET_SPEC
    assert reg.handler(WIDGET).spec == WIDGET_SPEC


def test_class_instance_plugin() -> None:
    class Widgets:
        @hookimpl
        def ungater_kinds(self) -> list[KindSpec]:
            return [WIDGET_SPEC]

        @hookimpl
        def ungater_pod_set(self, owner: ObjectRef, pod: Any) -> str:
            return "from-class"

    reg = PluginRegistry.from_modules({"cls": Widgets()})
    assert reg.handler(WIDGET).pod_set(OWNER, POD) == "from-class"


def test_module_plugin() -> None:
    mod = types.ModuleType("fake_widgets_plugin")
    for name, fn in {"kinds": lambda: [WIDGET_SPEC], **good_hooks("mod")}.items():
        setattr(mod, f"ungater_{name}", hookimpl(fn))
    reg = PluginRegistry.from_modules({"mod": mod})
    h = reg.handler(WIDGET)
    assert h.pod_set(OWNER, POD) == "mod-set"
    assert h.release_group(OWNER, POD) == ReleaseGroup("mod-g", 2)


# -- load failures ------------------------------------------------------------------------------


def test_failing_ungater_kinds_is_recorded_and_others_keep_working() -> None:
    reg = PluginRegistry.from_modules(
        {
            "broken": plugin(RuntimeError("boom"), pod_set=lambda owner, pod: "broken-set"),
            "widgets": plugin(**good_hooks()),
        }
    )
    (failed,) = reg.failures
    assert failed.name == "broken"
    assert "ungater_kinds failed" in failed.error and "RuntimeError: boom" in failed.error
    assert failed.kinds == []
    assert reg.plugins["widgets"].error == ""
    h = reg.handler(WIDGET)
    assert h.plugin.name == "widgets"
    assert h.pod_set(OWNER, POD) == "good-set"  # the broken plugin's hooks are gone
    assert reg.all_kinds() == [WIDGET]
    assert failed.as_dict()["error"] == failed.error


@pytest.mark.parametrize(
    ("kinds", "needle"),
    [
        pytest.param(None, "TypeError", id="none"),
        pytest.param([("example.com", "Widget")], "expected KindSpec items", id="tuples"),
        pytest.param(5, "TypeError", id="int"),
    ],
)
def test_ill_typed_ungater_kinds_is_a_failure(kinds: Any, needle: str) -> None:
    reg = PluginRegistry.from_modules({"bad": plugin(kinds), "widgets": plugin(**good_hooks())})
    assert [p.name for p in reg.failures] == ["bad"]
    assert needle in reg.plugins["bad"].error
    assert reg.handler(WIDGET).plugin.name == "widgets"


def test_misspelt_hook_rejects_the_plugin() -> None:
    bad = plugin()
    bad.ungater_pod_sett = hookimpl(lambda owner, pod: "x")
    reg = PluginRegistry.from_modules({"typo": bad, "widgets": plugin(**good_hooks())})
    assert [p.name for p in reg.failures] == ["typo"]
    assert "registration failed" in reg.plugins["typo"].error
    assert reg.handler(WIDGET).plugin.name == "widgets"


def test_hook_with_unknown_argument_rejects_the_plugin() -> None:
    bad = plugin(pod_set=lambda owner, pod, colour: "x")
    reg = PluginRegistry.from_modules({"sig": bad})
    assert "registration failed" in reg.plugins["sig"].error
    with pytest.raises(LookupError):
        reg.handler(WIDGET)


def test_same_object_under_two_names() -> None:
    p = plugin(**good_hooks())
    reg = PluginRegistry.from_modules({"first": p, "second": p})
    assert [f.name for f in reg.failures] == ["second"]
    assert reg.handler(WIDGET).plugin.name == "first"


# -- hooks that raise or return the wrong thing --------------------------------------------------


def _handler(**hooks: Callable[..., Any]) -> KindHandler:
    return PluginRegistry.from_modules({"fake": plugin(**hooks)}).handler(WIDGET)


@pytest.mark.parametrize(
    ("hook", "call"),
    [
        ("pod_selector", lambda h: h.pod_selector(OWNER)),
        ("owns_pod", lambda h: h.owns_pod(OWNER, POD, [])),
        ("pod_set", lambda h: h.pod_set(OWNER, POD)),
        ("sort_key", lambda h: h.sort_key(OWNER, POD)),
        ("release_group", lambda h: h.release_group(OWNER, POD)),
    ],
)
def test_raising_hook_is_a_plugin_error(hook: str, call: Callable[[KindHandler], Any]) -> None:
    params = {
        "pod_selector": "owner",
        "owns_pod": "owner, pod, chain",
        "pod_set": "owner, pod",
        "sort_key": "owner, pod",
        "release_group": "owner, pod",
    }[hook]
    ns: dict[str, Any] = {}
    exec(f"def fn({params}):\n    raise KeyError('missing label')", ns)
    h = _handler(**{hook: ns["fn"]})
    with pytest.raises(PluginError) as info:
        call(h)
    err = info.value
    assert err.plugin.name == "fake" and err.hook == f"ungater_{hook}"
    assert str(err).startswith(f"plugin fake: ungater_{hook}: KeyError")
    assert "missing label" in err.detail
    assert isinstance(err.__cause__, KeyError)


@pytest.mark.parametrize(
    ("hooks", "call", "needle"),
    [
        pytest.param(
            {"pod_set": lambda owner, pod: 3},
            lambda h: h.pod_set(OWNER, POD),
            "not a str: 3",
            id="pod_set-int",
        ),
        pytest.param(
            {"pod_set": lambda owner, pod: b"main"},
            lambda h: h.pod_set(OWNER, POD),
            "not a str",
            id="pod_set-bytes",
        ),
        pytest.param(
            {"sort_key": lambda owner, pod: [1, 2]},
            lambda h: h.sort_key(OWNER, POD),
            "not a tuple of int/str: [1, 2]",
            id="sort_key-list",
        ),
        pytest.param(
            {"sort_key": lambda owner, pod: (1, 2.5)},
            lambda h: h.sort_key(OWNER, POD),
            "not a tuple of int/str",
            id="sort_key-float-item",
        ),
        pytest.param(
            {"sort_key": lambda owner, pod: 7},
            lambda h: h.sort_key(OWNER, POD),
            "not a tuple",
            id="sort_key-int",
        ),
        pytest.param(
            {"release_group": lambda owner, pod: ("g", 2)},
            lambda h: h.release_group(OWNER, POD),
            "not a ReleaseGroup",
            id="release_group-tuple",
        ),
        pytest.param(
            {"pod_selector": lambda owner: {"app": "x"}},
            lambda h: h.pod_selector(OWNER),
            "selector lacks 'example.com/widget-uid'",
            id="selector-lacks-pod-label",
        ),
        pytest.param(
            {"pod_selector": lambda owner: {"example.com/widget-uid": 5}},
            lambda h: h.pod_selector(OWNER),
            "not a str map",
            id="selector-int-value",
        ),
        pytest.param(
            {"pod_selector": lambda owner: [("example.com/widget-uid", "x")]},
            lambda h: h.pod_selector(OWNER),
            "not a str map",
            id="selector-list",
        ),
        pytest.param(
            {},
            lambda h: h.pod_selector(OWNER),
            "not a str map: None",
            id="selector-not-implemented",
        ),
    ],
)
def test_ill_typed_returns_are_plugin_errors(
    hooks: dict[str, Callable[..., Any]], call: Callable[[KindHandler], Any], needle: str
) -> None:
    with pytest.raises(PluginError, match="plugin fake") as info:
        call(_handler(**hooks))
    assert needle in info.value.detail


def test_selector_result_is_copied() -> None:
    sel = {"example.com/widget-uid": "owner-uid", "extra": "y"}
    h = _handler(pod_selector=lambda owner: sel)
    out = h.pod_selector(OWNER)
    assert out == sel and out is not sel


@pytest.mark.parametrize(("value", "expected"), [(True, True), (False, False), (None, False)])
def test_owns_pod_answers_a_bool_and_no_answer_is_no(value: Any, expected: bool) -> None:
    h = _handler(owns_pod=lambda owner, pod, chain: value)
    assert h.owns_pod(OWNER, POD, [OWNER]) is expected


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(1, id="one"),
        pytest.param("yes", id="str"),
        pytest.param([OWNER], id="list"),
    ],
)
def test_owns_pod_answering_anything_else_is_a_plugin_error(value: Any) -> None:
    """Never a release (the owner is skipped), and the error names the plugin and the hook."""
    h = _handler(owns_pod=lambda owner, pod, chain: value)
    with pytest.raises(PluginError, match=r"ungater_owns_pod: not a bool") as info:
        h.owns_pod(OWNER, POD, [OWNER])
    assert info.value.plugin.name in str(info.value)


def test_owns_pod_receives_the_chain_as_a_tuple() -> None:
    seen: list[Any] = []
    h = _handler(owns_pod=lambda owner, pod, chain: seen.append(chain) or True)
    assert h.owns_pod(OWNER, POD, [OWNER]) is True
    assert seen == [(OWNER,)]


def test_defaults_when_hooks_are_absent_or_empty() -> None:
    h = _handler()  # only ungater_kinds
    assert h.owns_pod(OWNER, POD, [OWNER]) is False
    assert h.pod_set(OWNER, POD) is None
    assert h.sort_key(OWNER, POD) == ()
    assert h.release_group(OWNER, POD) is None
    h = _handler(pod_set=lambda owner, pod: "", sort_key=lambda owner, pod: None)
    assert h.pod_set(OWNER, POD) is None  # "" means unknown
    assert h.sort_key(OWNER, POD) == ()
    h = _handler(sort_key=lambda owner, pod: ("a", 0, True))
    assert h.sort_key(OWNER, POD) == ("a", 0, True)


# -- plugin info ----------------------------------------------------------------------------------


def test_plugin_info_label_and_dict() -> None:
    info = PluginInfo("job", "ungater", "0.1.0", [WIDGET_SPEC])
    assert info.label == "job (ungater 0.1.0)"
    assert PluginInfo("local").label == "local"
    assert info.as_dict() == {
        "name": "job",
        "distribution": "ungater",
        "version": "0.1.0",
        "kinds": ["Widget.example.com"],
        "error": "",
    }


def test_plugin_info_label_without_version() -> None:
    assert PluginInfo("job", "dist").label == "job (dist)"
