"""State shared by the migration transforms of one file.

It decides, once, the facts every transform needs: which DataParallel references exist,
whether the file can be migrated at all, which local names the inserted code uses
(``dist``, ``DistributedDataParallel``, ...), and where the process-group set-up goes.
"""

from __future__ import annotations

from functools import cached_property
from typing import Dict, List, Optional, Tuple

import libcst as cst

from dp2ddp.analysis import DDP_NAMES, DP_NAMES, Analysis, code
from dp2ddp.engine import AddImport, Edit, Finding
from dp2ddp.templates import render_statements

# (key, module, obj, default local name)
_IMPORTS = {
    "os": ("os", None, "os"),
    "atexit": ("atexit", None, "atexit"),
    "torch": ("torch", None, "torch"),
    "dist": ("torch.distributed", None, "dist"),
    "DDP": ("torch.nn.parallel", "DistributedDataParallel", "DistributedDataParallel"),
    "DistributedSampler": ("torch.utils.data.distributed", "DistributedSampler", "DistributedSampler"),
}
_QUALIFIED = {
    "os": {"os"},
    "atexit": {"atexit"},
    "torch": {"torch"},
    "dist": {"torch.distributed"},
    "DDP": set(DDP_NAMES),
    "DistributedSampler": {"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"},
}

ALREADY_DISTRIBUTED = frozenset(
    set(DDP_NAMES)
    | {
        "torch.distributed.init_process_group",
        "torch.multiprocessing.spawn",
        "torch.distributed.launch",
        "torch.distributed.run",
    }
)


class MigrationContext:
    def __init__(self, an: Analysis, options) -> None:
        self.an = an
        self.options = options
        self.findings: List[Finding] = []
        self.extra_edits: List[Edit] = []
        self.dp_refs = an.refs(DP_NAMES)
        self.applicable = bool(self.dp_refs)
        self.blocked = False
        self._names: Dict[str, str] = {}
        if self.applicable:
            self._check_already_distributed()

    # ------------------------------------------------------------------ findings
    def note(self, node, code_: str, message: str) -> Finding:
        return Finding(code_, message, node, severity="info")

    def warn(self, node, code_: str, message: str) -> Finding:
        return Finding(code_, message, node, severity="warning")

    def block(self, node, code_: str, message: str) -> Finding:
        return Finding(code_, message, node, severity="error")

    def _check_already_distributed(self) -> None:
        for ref in self.an.refs(ALREADY_DISTRIBUTED):
            self.findings.append(
                self.block(
                    ref,
                    "DDP104",
                    f"script already uses {sorted(self.an.qnames(ref) & ALREADY_DISTRIBUTED)[0]}; "
                    "a mixed DataParallel/distributed script is left for a human to migrate",
                )
            )
            self.blocked = True
            return

    def cache_get(self, key: str, factory):
        if key not in self.an.cache:
            self.an.cache[key] = factory()
        return self.an.cache[key]

    def fresh_name(self, base: str) -> str:
        """An identifier not used anywhere in the module (nor handed out before)."""
        taken = self.an.all_identifiers | self.cache_get("fresh_names", set)
        name, i = base, 2
        while name in taken:
            name, i = f"{base}{i}", i + 1
        self.an.cache["fresh_names"].add(name)
        return name

    # ------------------------------------------------------------------ names
    def name(self, key: str) -> str:
        """Local name under which the inserted code refers to ``key``; adds the import."""
        if key in self._names:
            return self._names[key]
        module, obj, default = _IMPORTS[key]
        local = self._existing_binding(_QUALIFIED[key])
        if local is None:
            local = default
            taken = self.an.all_identifiers
            if local in taken and not self._bound_to(local, _QUALIFIED[key]):
                base = "ddp_" + default if default.islower() else default + "_"
                local = base
                i = 2
                while local in taken:
                    local, i = f"{base}{i}", i + 1
            asname = None if local == (obj or module) else local
            self.extra_edits.append(AddImport(module, obj, asname))
        self._names[key] = local
        return local

    def _existing_binding(self, qualified: set) -> Optional[str]:
        scope = self.an.scope_of(self.an.module)
        if scope is None:
            return None
        for assignment in scope.assignments:
            node = getattr(assignment, "node", None)
            if isinstance(node, (cst.Import, cst.ImportFrom)):
                for qn in scope.get_qualified_names_for(assignment.name):
                    if qn.name in qualified and "." not in assignment.name:
                        return assignment.name
        return None

    def _bound_to(self, local: str, qualified: set) -> bool:
        return self._existing_binding(qualified) == local

    # ------------------------------------------------------------------ code building
    def render(self, template: str, **values: str) -> List[cst.BaseStatement]:
        return render_statements(template, self.an.module, **self._template_values(values))

    def expr(self, text: str, **values) -> cst.BaseExpression:
        return cst.parse_expression(text.format(**self._template_values(values)), config=self.an.module.config_for_parsing)

    def stmt(self, text: str, **values) -> cst.BaseStatement:
        return cst.parse_statement(text.format(**self._template_values(values)), config=self.an.module.config_for_parsing)

    def _template_values(self, values: Dict[str, object]) -> Dict[str, str]:
        out = {}
        for k, v in values.items():
            out[k] = code(v) if isinstance(v, cst.CSTNode) else str(v)
        return out

    def rank0_test(self) -> cst.BaseExpression:
        return self.expr("{dist}.get_rank() == 0", dist=self.name("dist"))

    def ddp_call(self, module_expr: cst.BaseExpression) -> cst.Call:
        return self.expr(
            "{DDP}({m}, device_ids=[{torch}.cuda.current_device()] if {torch}.cuda.is_available() else None)",
            DDP=self.name("DDP"),
            torch=self.name("torch"),
            m=module_expr,
        )

    # ------------------------------------------------------------------ placement
    @cached_property
    def setup_site(self) -> Tuple[str, Optional[cst.CSTNode], Optional[cst.CSTNode]]:
        """Where the process-group set-up goes: ``("function", main_def, call_stmt)`` when the
        main guard calls a function that does the work, ``("guard", guard, None)`` when the work
        is in the guard body itself, else ``("module", None, None)``."""
        an = self.an
        guard = an.main_guard
        module_level_work = [
            n
            for n in self.dp_refs + an.calls({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
            if an.enclosing_function(n) is None and (guard is None or not an.contains(guard, n))
        ]
        if guard is None or module_level_work:
            return ("module", None, None)
        work_funcs = {an.enclosing_function(r) for r in self.dp_refs} - {None}
        for stmt in guard.body.body if isinstance(guard.body, cst.IndentedBlock) else ():
            if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
                continue
            small = stmt.body[0]
            value = small.value if isinstance(small, (cst.Expr, cst.Assign)) else None
            if isinstance(value, cst.Call) and isinstance(value.func, cst.Name):
                func = an.module_functions.get(value.func.value)
                if func is None:
                    continue
                reach = an.function_reach(func)
                # methods of classes instantiated from the reach are not followed; accept a
                # function that reaches the wraps, or the conventional entry-point names
                if work_funcs & reach or func.name.value in ("main", "run", "train", "cli"):
                    if any(an.contains(guard, r) for r in self.dp_refs):
                        return ("guard", guard, None)
                    return ("function", func, stmt)
        return ("guard", guard, None)

    def in_setup_region(self, node: cst.CSTNode) -> bool:
        """True when code at ``node`` runs after the process group is initialised."""
        kind, where, _ = self.setup_site
        func = self.an.enclosing_function(node)
        if kind == "function":
            return func is not None
        if kind == "guard":
            return func is not None or self.an.contains(where, node)
        if func is not None:
            return True
        end = self.an.top_import_end
        stmt = self.an.statement_of(node)
        top = stmt
        while top is not None and self.an.parent(top) is not self.an.module:
            top = self.an.statement_of(self.an.parent(top)) if self.an.parent(top) is not None else None
        if top is None:
            return True
        body = list(self.an.module.body)
        start = body.index(end) + 1 if end is not None and end in body else 0
        return body.index(top) >= start
