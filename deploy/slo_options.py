"""The SLO options of the alert rules and dashboards, and their file names (a module of its own: the CLI builds
`stoke alerts render`'s flags from these defaults without loading the renderer, YAML or the planner)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from foundation.errors import InputError
from foundation.names import shown

DEFAULT_HISTOGRAM = "stoke_request_latency_ms"
DEFAULT_OBJECTIVE = 0.999
DEFAULT_PERIOD_DAYS = 30

RULES_FILE = "prometheus-rules.yml"
RULES_TEST_FILE = "prometheus-rules.test.yml"
DASHBOARD_FILE = "grafana-dashboard.json"
GRAFANA_ALERTS_FILE = "grafana-alerts.yml"

_LABEL_VALUE = re.compile(r'^[^"\\\n]*$')
#: One Prometheus label matcher of a selector template: a label name, an operator and a double-quoted value in
#: which {model} and {name} are replaced, {{ and }} are literal braces, and a backslash escapes one of abfnrtv\"
#: (PromQL's escapes in a double-quoted string; a regex's \d is written \\d); no control character. Spaces
#: and tabs may surround the name, the operator and the value.
_MATCHER = re.compile(
    r"[ \t]*[a-zA-Z_][a-zA-Z0-9_]*[ \t]*(?:=~|!~|!=|=)[ \t]*"
    r'(?:"(?:[^"\\{}\x00-\x1f\x7f]|\\[abfnrtv\\"]|\{\{|\}\}|\{(?:model|name)\})*"'
    # PromQL also takes a single-quoted value (its escapes, with \' for a quote) and a raw backtick one
    r"|'(?:[^'\\{}\x00-\x1f\x7f]|\\[abfnrtv\\']|\{\{|\}\}|\{(?:model|name)\})*'"
    r"|`(?:[^`{}\x00-\x1f\x7f]|\{\{|\}\}|\{(?:model|name)\})*`)[ \t]*"
)
#: What a selector template's braces may be: a placeholder or a doubled (literal) brace.
_BRACES = re.compile(r"\{\{|\}\}|\{(?:model|name)\}")
SELECTOR_FORM = (
    'label="value", ...: a label name, one of = != =~ !~ and a quoted value ("...", \'...\' or `...`), in which '
    "{model} and {name} are replaced"
)
_GRAFANA_UID = re.compile(r"[a-zA-Z0-9_-]{1,40}")
DEFAULT_DASHBOARD_UID = "stoke-slo"
DEFAULT_DATASOURCE_UID = "prometheus"


class AlertConfigError(InputError):
    """Options or workloads cannot be turned into valid rules; the message names the field."""


@dataclass(frozen=True)
class SloOptions:
    """How SLIs are measured and judged. Defaults: 99.9 % over 30 days, the serving path's histogram."""

    objective: float = DEFAULT_OBJECTIVE  # share of requests that must meet the SLO
    period_days: int = DEFAULT_PERIOD_DAYS  # SLO period (budget window)
    histogram: str = DEFAULT_HISTOGRAM  # histogram metric family, in milliseconds
    selector: str = 'workload="{name}"'  # label matchers of one workload's series
    # label matchers of one workload's Triton series: Triton labels them only by model, so a workload
    # label must come from the scrape (each Triton process serves one workload); see `panel_rules`
    triton_selector: str = 'model="{model}",workload="{name}"'
    dashboard_uid: str = DEFAULT_DASHBOARD_UID  # stable Grafana uid, whatever the workloads
    rule_interval: str | None = None  # group evaluation interval (None: Prometheus' global)
    # uid of the Grafana Prometheus data source the alert rules query (the dashboard offers a picker instead);
    # Grafana gives data sources random uids unless provisioned with one, so the default must be said aloud
    datasource_uid: str = DEFAULT_DATASOURCE_UID
    folder: str = "stoke"  # Grafana folder of the alert rules
    org_id: int = 1
    #: how long a workload may stay pending (planned for, not placed) before StokeWorkloadPending fires
    pending_for: str = "5m"

    def __post_init__(self) -> None:
        if (
            isinstance(self.objective, bool)
            or not isinstance(self.objective, (int, float))
            or not 0.0 < self.objective < 1.0
        ):
            raise AlertConfigError(f"objective must be a ratio in (0, 1) such as 0.999, got {self.objective!r}")
        if isinstance(self.period_days, bool) or not isinstance(self.period_days, int) or self.period_days < 1:
            raise AlertConfigError(f"period_days must be a whole number >= 1, got {self.period_days!r}")
        if not re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", self.histogram):
            raise AlertConfigError(f"histogram {self.histogram!r} is not a Prometheus metric name")
        for field_name in ("selector", "triton_selector"):
            value = getattr(self, field_name)
            problem = selector_problem(value)
            if problem:
                raise AlertConfigError(f"{field_name} {shown(value)}: {problem}", field_name)
        if not isinstance(self.pending_for, str) or not re.fullmatch(r"[1-9][0-9]{0,5}[smh]", self.pending_for):
            raise AlertConfigError(f"pending_for {self.pending_for!r} must be a duration such as 5m, 90s or 1h")
        if not isinstance(self.dashboard_uid, str) or not _GRAFANA_UID.fullmatch(self.dashboard_uid):
            raise AlertConfigError(
                f"dashboard uid {self.dashboard_uid!r} must be 1-40 characters of "
                f"[a-zA-Z0-9_-], e.g. {DEFAULT_DASHBOARD_UID!r}"
            )
        # Grafana's datasource uids follow the same rule; '' (or a quote, a newline) went into every alert rule
        if not isinstance(self.datasource_uid, str) or not _GRAFANA_UID.fullmatch(self.datasource_uid):
            raise AlertConfigError(
                f"datasource uid {shown(self.datasource_uid)} must be 1-40 characters of [a-zA-Z0-9_-] (the last "
                f"part of the datasource's URL in Grafana), e.g. {DEFAULT_DATASOURCE_UID!r}"
            )

    @property
    def error_budget(self) -> float:
        return 1.0 - self.objective

    @property
    def period(self) -> str:
        return f"{self.period_days}d"


def selector_problem(selector: object) -> str:
    """Why `selector` is not a template of Prometheus label matchers (`SloOptions.selector`); "" when it is.

    The rules put it inside braces beside other matchers (`metric{SELECTOR,le=~"..."}`), so it must be one or more
    matchers `label="value"` joined by commas (no trailing comma, no braces around it). {model} and {name} may
    appear only inside values.
    """
    if not isinstance(selector, str) or not selector.strip():
        return f"must be one or more label matchers ({SELECTOR_FORM}), got none"
    pos = 0
    while True:
        match = _MATCHER.match(selector, pos)
        if match is None:
            break
        pos = match.end()
        if pos == len(selector):
            return ""
        if selector[pos] != ",":
            break
        pos += 1
    for placeholder in re.findall(r"\{([a-zA-Z_][a-zA-Z0-9_]*)\}", _BRACES.sub("", selector)):
        return (
            f"may use only the placeholders {{model}} and {{name}}, got {shown('{' + placeholder + '}')} "
            f"(a literal brace is written {{{{ or }}}})"
        )
    if pos == len(selector):
        hint = "; drop the trailing comma"
    elif selector.strip().startswith("{") and selector.strip().endswith("}"):
        hint = "; give the matchers without the braces around them"
    elif re.search(r"[{}]", _BRACES.sub("", selector)):
        hint = "; a literal brace is written {{ or }}"
    else:
        hint = ""
    where = f" at {shown(selector[pos:])}" if 0 < pos < len(selector) else ""
    return f"not a list of label matchers{where} ({SELECTOR_FORM}){hint}"
