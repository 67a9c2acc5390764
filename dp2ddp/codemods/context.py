"""State shared by the migration transforms of one file.

The transforms read the module through the semantic model (``ctx.m``) and propose
findings whose fixes hold edits against LibCST nodes, found through ``ctx.bridge``.
This module decides, once, what several transforms need: the local names the inserted
code uses (``dist``, ``DistributedDataParallel`` ...), fresh identifiers, and where the
process-group set-up goes.
"""

from __future__ import annotations

import ast
from functools import cached_property
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import libcst as cst

from dp2ddp.engine import AddImport, Edit, Finding, Fix, RemoveImportIfUnused
from dp2ddp.model.bridge import Bridge
from dp2ddp.model.core import FUNCTIONS, SemanticModel
from dp2ddp.model.names import DATALOADER, DDP, DISTRIBUTED_SAMPLER
from dp2ddp.templates import render_statements

# key -> (module, obj, default local name)
_IMPORTS = {
    "os": ("os", None, "os"),
    "atexit": ("atexit", None, "atexit"),
    "contextlib": ("contextlib", None, "contextlib"),
    "torch": ("torch", None, "torch"),
    "dist": ("torch.distributed", None, "dist"),
    "DDP": ("torch.nn.parallel", "DistributedDataParallel", "DistributedDataParallel"),
    "DistributedSampler": ("torch.utils.data.distributed", "DistributedSampler", "DistributedSampler"),
}
_QUALIFIED = {
    "os": {"os"},
    "atexit": {"atexit"},
    "contextlib": {"contextlib"},
    "torch": {"torch"},
    "dist": {"torch.distributed"},
    "DDP": set(DDP),
    "DistributedSampler": set(DISTRIBUTED_SAMPLER),
}

Value = Union[str, ast.AST, cst.CSTNode]


class Context:
    def __init__(self, model: SemanticModel, bridge: Bridge, options) -> None:
        self.m = model
        self.bridge = bridge
        self.module: cst.Module = bridge.module
        self.options = options
        self.extra_edits: List[Edit] = []
        self.cache: Dict[str, object] = {}
        self._names: Dict[str, str] = {}
        self._fresh: set = set()
        self.mode = "plain"  # "plain": a DataParallel script; "mixed": it has its own distributed path

    # ------------------------------------------------------------------ findings
    def finding(self, node: Optional[ast.AST], code: str, message: str, severity: str, fix: Optional[Fix] = None) -> Finding:
        line, col = self.m.position(node) if node is not None else (1, 0)
        end_line, end_col = self.m.end_position(node) if node is not None else (1, 0)
        return Finding(code, message, node, fix=fix, line=line, col=col, severity=severity, end_line=end_line, end_col=end_col)

    def note(self, node, code: str, message: str, edits: Optional[Sequence[Edit]] = None) -> Finding:
        return self.finding(node, code, message, "info", Fix(list(edits)) if edits is not None else None)

    def warn(self, node, code: str, message: str) -> Finding:
        return self.finding(node, code, message, "warning")

    def block(self, node, code: str, message: str) -> Finding:
        return self.finding(node, code, message, "error")

    def unused_imports(self, wanted: Callable[[str, ast.alias], bool]) -> List[Edit]:
        """``RemoveImportIfUnused`` for each ``from module import name [as alias]`` (absolute)
        that ``wanted(module, alias)`` picks: LibCST drops it if nothing uses it after the edits."""
        return [
            RemoveImportIfUnused(imp.module, alias.name, alias.asname)
            for imp in self.m.nodes(ast.ImportFrom)
            if imp.module is not None and not imp.level
            for alias in imp.names
            if wanted(imp.module, alias)
        ]

    # ------------------------------------------------------------------ names
    def fresh_name(self, base: str) -> str:
        """An identifier not used anywhere in the module (nor handed out before)."""
        taken = self.m.all_identifiers | self._fresh
        name, i = base, 2
        while name in taken:
            name, i = f"{base}{i}", i + 1
        self._fresh.add(name)
        return name

    def name(self, key: str) -> str:
        """The local name under which inserted code refers to ``key``; adds the import."""
        if key in self._names:
            return self._names[key]
        module, obj, default = _IMPORTS[key]
        local = self._existing_binding(_QUALIFIED[key])
        if local is None:
            local = default
            if local in self.m.all_identifiers | self._fresh:
                base = "ddp_" + default if default.islower() else default + "_"
                local = self.fresh_name(base)
            asname = None if local == (obj or module) else local
            self.extra_edits.append(AddImport(module, obj, asname))
        self._names[key] = local
        return local

    def _existing_binding(self, qualified: set) -> Optional[str]:
        """A module-level import of one of ``qualified`` whose name nothing else binds."""
        scope = self.m.scopes[self.m.tree]
        for name, bindings in scope.bindings.items():
            if all(b.kind == "import" and b.qualified in qualified for b in bindings):
                if not any(name in s.bindings for s in self.m.scopes.values() if s is not scope):
                    return name
        return None

    # ------------------------------------------------------------------ code
    def text(self, value: Value) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, cst.CSTNode):
            return cst.Module(body=[]).code_for_node(value)
        return self.m.source(value)

    def _fmt(self, template: str, values: Dict[str, Value]) -> str:
        return template.format(**{k: self.text(v) for k, v in values.items()})

    def expr(self, template: str, **values: Value) -> cst.BaseExpression:
        return cst.parse_expression(self._fmt(template, values), config=self.module.config_for_parsing)

    def stmt(self, template: str, **values: Value) -> cst.BaseStatement:
        return cst.parse_statement(self._fmt(template, values), config=self.module.config_for_parsing)

    def render(self, template: str, **values: Value) -> List[cst.BaseStatement]:
        return render_statements(template, self.module, **{k: self.text(v) for k, v in values.items()})

    def cst(self, node: ast.AST) -> cst.CSTNode:
        return self.bridge.cst(node)

    def rank0(self) -> str:
        """A test that holds on rank 0 only (and, in a script with its own distributed path,
        also when that path is off: no process group)."""
        return f"{self._rank()} == 0"

    def not_rank0(self) -> str:
        return f"{self._rank()} != 0"

    def _rank(self) -> str:
        """This process's global rank. In a script with its own distributed path the process
        group may not exist yet (or at all, without torchrun): then torchrun's RANK, else 0."""
        dist = self.name("dist")
        if self.mode == "mixed":
            return f'({dist}.get_rank() if {dist}.is_initialized() else int({self.name("os")}.environ.get("RANK", 0)))'
        return f"{dist}.get_rank()"

    def ddp_call(self, module_text: str, find_unused: bool = False) -> str:
        torch = self.name("torch")
        extra = ", find_unused_parameters=True" if find_unused else ""
        return (
            f"{self.name('DDP')}({module_text}, device_ids=[{torch}.cuda.current_device()] "
            f"if {torch}.cuda.is_available() else None{extra})"
        )

    # ------------------------------------------------------------------ placement
    def work_nodes(self) -> List[ast.AST]:
        """What needs the process group: the DataParallel wraps, their owners and the loaders."""
        from dp2ddp.model.wraps import dp_wraps

        return [w.call for w in dp_wraps(self.m)] + list(self.m.calls(DATALOADER))

    @cached_property
    def setup_site(self) -> Tuple[str, Optional[ast.AST], Optional[ast.stmt]]:
        """Where the process-group set-up goes: ``("guard", guard, None)``, the top of the
        ``__main__`` guard, when all the work starts from there; else ``("module", None,
        None)``, right after the imports. Either way it runs before anything the script
        does, so every ``dist.get_rank()`` the migration adds runs after it."""
        m = self.m
        guard = m.main_guard
        if guard is None:
            return ("module", None, None)
        pre = self.pre_setup_functions
        work = self.work_nodes()
        for n in work:
            f = m.enclosing_function(n)
            if (f is None and not m.contains(guard, n)) or (f is not None and f in pre):
                return ("module", None, None)
        return ("guard", guard, None)

    @cached_property
    def pre_setup_functions(self) -> set:
        """Functions of the module that module-level code outside the main guard calls
        (at import): they may run before the set-up."""
        m = self.m
        guard = m.main_guard
        out: set = set()
        for stmt in m.tree.body:
            if stmt is guard or isinstance(stmt, FUNCTIONS + (ast.ClassDef,)):
                continue
            for call in ast.walk(stmt):
                if isinstance(call, ast.Call):
                    t = m.resolve_call(call)
                    if t is not None:
                        out |= m.reach(t)
        return out

    def in_setup_region(self, node: ast.AST) -> bool:
        """Code at ``node`` runs after the process group is initialised."""
        kind, where, _ = self.setup_site
        m = self.m
        func = m.enclosing_function(node)
        if func is not None:
            return kind == "module" or func not in self.pre_setup_functions
        if kind == "guard":
            return m.contains(where, node)  # type: ignore[arg-type]
        top = m.top_statement(node)
        end = m.top_import_end
        if top is None:
            return True
        body = m.tree.body
        start = next((i for i, s in enumerate(body) if s is end), -1) + 1
        return next(i for i, s in enumerate(body) if s is top) >= start


def is_function(node) -> bool:
    return isinstance(node, FUNCTIONS)
