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
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple, Type, TypeVar, Union

import libcst as cst

from dp2ddp.engine import AddImport, Edit, Finding, Fix, RemoveImportIfUnused
from dp2ddp.model.bridge import Bridge
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.inference import inference_only
from dp2ddp.model.names import DATALOADER, DDP, DISTRIBUTED_SAMPLER
from dp2ddp.model.syntax import FUNCTIONS, is_docstring
from dp2ddp.templates import render_statements

# key -> (module, obj, default local name)
_IMPORTS = {
    "os": ("os", None, "os"),
    "atexit": ("atexit", None, "atexit"),
    "random": ("random", None, "random"),
    "sys": ("sys", None, "sys"),
    "contextlib": ("contextlib", None, "contextlib"),
    "logging": ("logging", None, "logging"),
    "torch": ("torch", None, "torch"),
    "dist": ("torch.distributed", None, "dist"),
    "DDP": ("torch.nn.parallel", "DistributedDataParallel", "DistributedDataParallel"),
    "DistributedSampler": ("torch.utils.data.distributed", "DistributedSampler", "DistributedSampler"),
}
_QUALIFIED = {
    "os": {"os"},
    "atexit": {"atexit"},
    "random": {"random"},
    "sys": {"sys"},
    "contextlib": {"contextlib"},
    "logging": {"logging"},
    "torch": {"torch"},
    "dist": {"torch.distributed"},
    "DDP": set(DDP),
    "DistributedSampler": set(DISTRIBUTED_SAMPLER),
}

Value = Union[str, ast.AST, cst.CSTNode]
# ``ddp_call(..., find_unused=EVERY_PARAMETER)``: parameters frozen when the wrapper is built are
# unfrozen later (dp2ddp.codemods.find_unused): the wrapper must register them too
EVERY_PARAMETER = "every-parameter"
# ``ddp_call(..., find_unused=FROZEN_AT_WRAP)``: as EVERY_PARAMETER, with
# ``find_unused_parameters=True`` only where parameters are frozen when it runs (a model of
# code dp2ddp cannot read, which may unfreeze them later)
FROZEN_AT_WRAP = "frozen-at-wrap"
# the helper (template and name) that builds each such wrapper
_WRAP_HELPERS = {EVERY_PARAMETER: "wrap_every_parameter", FROZEN_AT_WRAP: "wrap_frozen_too"}
F = TypeVar("F")


class Context:
    def __init__(self, model: SemanticModel, bridge: Bridge, options) -> None:
        self.m = model
        self.bridge = bridge
        self.module: cst.Module = bridge.module
        self.options = options
        self.extra_edits: List[Edit] = []
        self._facts: Dict[type, object] = {}
        self._names: Dict[str, str] = {}
        self._added: Set[str] = set()  # names whose import this migration adds (at the top)
        self._fresh: set = set()
        self._wrap_helpers: Dict[str, str] = {}  # template -> the name of the helper ddp_call writes for it (_WRAP_HELPERS)
        self._load_either: Optional[str] = None  # the name of the helper load_either_keys() writes
        self._saves_on_rank_zero: Optional[str] = None  # the name of the helper saves_on_rank_zero() writes
        self._rank_zero_value: Optional[str] = None  # the name of the helper rank_zero_value() writes
        self._writes_nothing: Optional[str] = None  # the name of the class writes_nothing() writes
        self._wrap_alone: Optional[str] = None  # the name of the function wrap_alone() writes
        self._fed: Optional[str] = None  # the name of the function fed_like_the_wrapper() writes
        self.mode = "plain"  # "plain": a DataParallel script; "mixed": it has its own distributed path
        self.role = getattr(options, "role", "script")  # script | entry | helper (see dp2ddp.project)

    # ------------------------------------------------------------------ facts between transforms
    def provide(self, fact: object) -> None:
        """Record a fact for the transforms that need it (see :mod:`dp2ddp.codemods.facts`)."""
        self._facts[type(fact)] = fact

    def need(self, kind: Type[F]) -> F:
        """A fact an earlier transform provided; :class:`MissingFact` if none did."""
        from dp2ddp.codemods.facts import MissingFact

        try:
            return self._facts[kind]  # type: ignore[return-value]
        except KeyError:
            raise MissingFact(f"{kind.__name__} is needed before any transform provided it") from None

    def has(self, kind: type) -> bool:
        return kind in self._facts

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
        """A reason to leave the file unchanged; with ``--accept CODE`` a warning instead,
        and the output says so in a comment above the statement."""
        if code in getattr(self.options, "accept", ()):
            text = f"# dp2ddp: accepted {code}: this statement was not migrated safely (see `dp2ddp rewrite` output)"
            edits = self.comment_above(node, text)
            return self.finding(node, code, f"{message} (accepted: written anyway)", "warning", Fix(edits) if edits else None)
        return self.finding(node, code, message, "error")

    def comment_above(self, node, text: str) -> List[Edit]:
        """A comment line above the statement that holds ``node`` (none where that
        statement shares its line with others)."""
        from dp2ddp.engine import Replace

        stmt = self.m.statement_of(node) if node is not None else None
        if stmt is None:
            return []
        line = self.bridge.statement(stmt)
        if not hasattr(line, "leading_lines"):
            return []
        comment = cst.EmptyLine(comment=cst.Comment(text))
        return [Replace(line, lambda u: u.with_changes(leading_lines=[*u.leading_lines, comment]))]

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

    def name(self, key: str, by: Optional[int] = None) -> str:
        """The local name under which inserted code refers to ``key``; adds the import.
        With ``by`` (a line of the module), code that runs at import right after that line
        uses it: a script's own import of ``key`` further down (after a statement such as
        ``matplotlib.use("agg")``) is not bound yet there, so the import is added."""
        known = self._names.get(key)
        if known is not None and (by is None or known in self._added or self._existing_binding(_QUALIFIED[key], by) == known):
            return known
        module, obj, default = _IMPORTS[key]
        local = self._existing_binding(_QUALIFIED[key], by)
        if local is None:
            local = default
            if local in self.m.all_identifiers | self._fresh:
                base = "ddp_" + default if default.islower() else default + "_"
                local = self.fresh_name(base)
            asname = None if local == (obj or module) else local
            self.extra_edits.append(AddImport(module, obj, asname))
            self._added.add(local)
        self._names[key] = local
        return local

    def _existing_binding(self, qualified: set, by: Optional[int] = None) -> Optional[str]:
        """A module-level import of one of ``qualified`` whose name nothing else binds (with
        ``by``: made on that line or before)."""
        scope = self.m.scopes[self.m.tree]
        for name, bindings in scope.bindings.items():
            if all(b.kind == "import" and b.qualified in qualified for b in bindings):
                if by is not None and any(getattr(b.node, "lineno", 0) > by for b in bindings):
                    continue
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

    def define_after_imports(self, template: str, **values: Value) -> None:
        """Write a helper template (a function or class the migration defines once) after
        the import section at the top of the module, two blank lines above it."""
        stmts = self.render(template, **values)
        stmts[0] = stmts[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
        edit = self.helper_edit(stmts, [v for v in values.values() if isinstance(v, str) and v.isidentifier()])
        if edit is not None:
            self.extra_edits.append(edit)

    def helper_edit(self, stmts: Sequence[cst.BaseStatement], names: List[str]):
        """The edit that defines ``stmts`` (a helper the migration writes once; ``names``: the
        modules it names) where :meth:`helper_anchor` says, or above the first statement that
        is not the module's docstring."""
        from dp2ddp.engine import InsertAfter, InsertBefore

        defined = {st.name.value for st in stmts if isinstance(st, (cst.FunctionDef, cst.ClassDef))}
        end = self.helper_anchor(names, defined)
        if end is not None:
            return InsertAfter(self.bridge.statement(end), tuple(stmts))
        first = next((s for s in self.m.tree.body if not is_docstring(s)), None)
        return InsertBefore(self.bridge.statement(first), tuple(stmts)) if first is not None else None

    def helper_anchor(self, names: List[str], defined: Set[str]) -> Optional[ast.stmt]:
        """Where a helper definition goes: after the import section at the top, or after a
        later top-level import of a module it names (Autoformer's ``exp_main.py`` imports
        ``torch`` below a ``logging.basicConfig(...)`` call), provided no top-level statement
        before that import names what it defines (``defined``)."""
        m = self.m
        end = m.top_import_end
        body = m.tree.body
        start = body.index(end) if end is not None else -1

        def binds(stmt: ast.stmt) -> Set[str]:
            if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
                return set()
            return {a.asname or a.name.split(".")[0] for a in stmt.names}

        bound_early = set().union(*(binds(st) for st in body[:start + 1])) if start >= 0 else set()
        last = start
        for i, stmt in enumerate(body):
            if i > start and (binds(stmt) & set(names)) - bound_early:
                last = i  # a module the helpers name, first bound by this later import
        if last == start:
            return end
        between = body[start + 1:last + 1]
        settings_only = all(isinstance(st, (ast.Import, ast.ImportFrom, ast.Expr)) for st in between)
        if not (settings_only or self._nothing_to_migrate(between)) or any(
                isinstance(n, ast.Name) and n.id in defined for st in between for n in ast.walk(st)):
            return end  # code between that may use what the migration defines (its edits are in that code)
        while last + 1 < len(body) and isinstance(body[last + 1], (ast.Import, ast.ImportFrom)):
            last += 1  # below the rest of that import block, not inside it
        return body[last]

    def _nothing_to_migrate(self, stmts: Sequence[ast.stmt]) -> bool:
        """Top-level code that names nothing of torch and writes no file (CondenseNet's
        argument parsing and ``os.environ["CUDA_VISIBLE_DEVICES"] = args.gpu`` before its
        ``import torch``): no edit of the migration lands in it, so a helper defined after a
        later import that it needs is defined before anything uses it."""
        from dp2ddp.model.writers import writers

        m = self.m
        for st in stmts:
            for n in ast.walk(st):
                if isinstance(n, (ast.Name, ast.Attribute)) and any(
                        q == "torch" or q.startswith(("torch.", "tensorboard", "tensorboardX", "wandb"))
                        for q in m.qualified_names(n)):
                    return False
        return not any(w.kind != "print" and any(m.contains(st, w.call) for st in stmts) for w in writers(m))

    def cst(self, node: ast.AST) -> cst.CSTNode:
        return self.bridge.cst(node)

    def rank0(self) -> str:
        """A test that holds on rank 0 only (and, in a script with its own distributed path,
        also when that path is off: no process group)."""
        return f"{self._rank()} == 0"

    def env_rank0(self) -> str:
        """Rank 0 before the process group exists: torchrun's RANK (absent: a world of one)."""
        return f'int({self.name("os")}.environ.get("RANK", 0)) == 0'

    def barrier(self, on: str = "", comment: str = ""):
        """A ``dist.barrier()`` statement; ``on``: ``"rank0"`` or ``"others"`` for one that
        only those ranks pass. In a script with its own distributed path, or a helper module
        an evaluation script may import, the process group may not exist: there the barrier
        waits only where it does."""
        dist = self.name("dist")
        rank = {"rank0": f"{dist}.get_rank() == 0", "others": f"{dist}.get_rank() != 0", "": ""}[on]
        if self.mode == "mixed" or self.role == "helper":
            test = f"{dist}.is_initialized()" + (f" and {rank}" if rank else "")
        else:
            test = rank
        call = f"{dist}.barrier()" + (f"  # {comment}" if comment else "")
        return self.stmt(f"if {test}:\n    {call}\n" if test else call + "\n")

    def env_not_rank0(self) -> str:
        """Not rank 0, before the process group exists (see :meth:`env_rank0`)."""
        return f'int({self.name("os")}.environ.get("RANK", 0)) != 0'

    def not_rank0(self) -> str:
        return f"{self._rank()} != 0"

    def rank(self) -> str:
        """This process's global rank, as an expression (see :meth:`_rank`)."""
        return self._rank()

    def _rank(self) -> str:
        """This process's global rank. In a script with its own distributed path the process
        group may not exist yet (or at all, without torchrun): then torchrun's RANK, else 0."""
        dist = self.name("dist")
        if self.mode == "mixed" or self.role == "helper":
            # a helper module may also be imported where no process group exists (an evaluation script)
            return f'({dist}.get_rank() if {dist}.is_initialized() else int({self.name("os")}.environ.get("RANK", 0)))'
        return f"{dist}.get_rank()"

    def ddp_call(self, module_text: str, find_unused: Union[bool, str] = False, cls: Optional[str] = None,
                 sync_bn: bool = False) -> str:
        """``DistributedDataParallel(module, device_ids=...)`` (with ``broadcast_buffers=False``
        in a script that only evaluates); ``find_unused``: with
        ``find_unused_parameters=True``, and for :data:`EVERY_PARAMETER` built through a helper
        written once into the script that registers the frozen parameters too; ``cls``: the script's own
        subclass (rebased on DistributedDataParallel) that the original called instead;
        ``sync_bn``: the original's DataParallel synchronised BatchNorm across the GPUs
        (:mod:`dp2ddp.model.sync_bn`), so the module's BatchNorm layers become
        ``SyncBatchNorm`` (CUDA only, as torch's SyncBatchNorm; only one branch runs, so the
        module expression is evaluated once)."""
        torch = self.name("torch")
        extra = ", find_unused_parameters=True" if find_unused and find_unused != FROZEN_AT_WRAP else ""
        if self.role != "helper" and inference_only(self.m):
            # a script that only evaluates: nothing to synchronise after the weights (and
            # buffers) are broadcast at construction; without it the first forward would
            # broadcast the buffers again, a collective a rank with no batch in a pass would miss
            extra += ", broadcast_buffers=False"
        inner = module_text
        if sync_bn:
            inner = (f"{torch}.nn.SyncBatchNorm.convert_sync_batchnorm({module_text}) "
                     f"if {torch}.cuda.is_available() else {module_text}")
        wrapper = cls or self.name("DDP")
        if find_unused in _WRAP_HELPERS:
            name = _WRAP_HELPERS[find_unused]  # type: ignore[index]
            helper = self._wrap_helpers.get(name)
            if helper is None:
                helper = self._wrap_helpers[name] = self.fresh_name(name)
                self.define_after_imports(f"{name}.py.tmpl", helper=helper)
            wrapper, inner = helper, f"{wrapper}, {inner}"
        call = (
            f"{wrapper}({inner}, device_ids=[{torch}.cuda.current_device()] "
            f"if {torch}.cuda.is_available() else None{extra})"
        )
        if self.role == "helper":
            # a project module: also imported where no process group exists (an evaluation script)
            return f"{call} if {self.name('dist')}.is_initialized() else {module_text}"
        return call

    def load_either_keys(self) -> str:
        """The name of ``load_either_keys(module)``, written once into the module:
        ``module.load_state_dict`` taking a state_dict with or without DataParallel's
        ``module.`` key prefix."""
        if self._load_either is None:
            self._load_either = self.fresh_name("load_either_keys")
            self.define_after_imports("load_either_keys.py.tmpl", helper=self._load_either, torch=self.name("torch"))
        return self._load_either

    def saves_on_rank_zero(self) -> str:
        """The name of ``saves_on_rank_zero(function)``, written once into the module: the
        function run on every rank, its ``torch.save`` calls writing only on rank 0."""
        if self._saves_on_rank_zero is None:
            self._saves_on_rank_zero = self.fresh_name("saves_on_rank_zero")
            self.define_after_imports("saves_on_rank_zero.py.tmpl", helper=self._saves_on_rank_zero,
                                      torch=self.name("torch"), dist=self.name("dist"))
        return self._saves_on_rank_zero

    def rank_zero_value(self) -> str:
        """The name of ``rank_zero_value(value)``, written once into the module: rank 0's
        value on every rank (one broadcast), for a name read from the clock."""
        if self._rank_zero_value is None:
            self._rank_zero_value = self.fresh_name("rank_zero_value")
            self.define_after_imports("rank_zero_value.py.tmpl", rank_zero_value=self._rank_zero_value, dist=self.name("dist"))
        return self._rank_zero_value

    def writes_nothing(self) -> str:
        """The name of a class, written once into the module, whose objects stand in for a
        SummaryWriter on the ranks other than 0: its ``add_*``/``flush``/``close`` do nothing."""
        if self._writes_nothing is None:
            self._writes_nothing = self.fresh_name("WritesNothing")
            self.define_after_imports("writes_nothing.py.tmpl", cls=self._writes_nothing)
        return self._writes_nothing

    def wrap_alone(self) -> str:
        """The name of a function, written once into the module, that wraps a model in
        DistributedDataParallel over a world of one process, starting that world where no
        process group exists (a mixed script's DataParallel fallback under plain python)."""
        if self._wrap_alone is None:
            self._wrap_alone = self.fresh_name("wrap_alone")
            self.define_after_imports("wrap_alone.py.tmpl", fn=self._wrap_alone, dist=self.name("dist"), torch=self.name("torch"),
                                      atexit=self.name("atexit"), DDP=self.name("DDP"))
        return self._wrap_alone

    def module_of(self, text: str) -> str:
        """The bare model behind a wrapper named ``text``: ``text.module``; in a helper module
        (where the wrapper exists only under a process group) whichever it holds."""
        if self.role == "helper" or self.mode == "mixed":
            return f'getattr({text}, "module", {text})'
        return f"{text}.module"

    def fed_like_the_wrapper(self) -> str:
        """The name of ``fed_like_the_wrapper(module)``, written once into the module: the bare
        model, for a forward that only some ranks run (:meth:`module_of`), whose forward moves
        its inputs onto its GPU as the wrapper did (a DataParallel forward of CPU tensors ran
        on the GPU; the bare module's raised there, an H200 run's finding)."""
        if self._fed is None:
            self._fed = self.fresh_name("fed_like_the_wrapper")
            self.define_after_imports("fed_like_the_wrapper.py.tmpl", helper=self._fed, torch=self.name("torch"))
        return self._fed

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
        if guard is None or self.role == "entry":
            # an entry script's helpers build the wrapper wherever its calls reach them: set up first
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

    def migrated_with(self, path: str) -> bool:
        """The project module at ``path`` is migrated in the same plan as this entry script
        (``rewrite --with-helpers``: :attr:`dp2ddp.migrate.Options.plan_modules`): what it
        writes, the folders it makes and the loaders it trains on are its own migration's."""
        import os

        return self.role == "entry" and bool(path) and os.path.realpath(path) in getattr(self.options, "plan_modules", ())

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


def append_arg(call: cst.Call, arg: cst.Arg) -> cst.Call:
    args = list(call.args)
    if not args:
        return call.with_changes(args=[arg])
    last = args[-1]
    trailing = last.comma
    if isinstance(trailing, cst.Comma):
        # `f(a, b,\n)`: keep the trailing comma (and its newline) after the new argument
        ws = trailing.whitespace_after
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=ws if isinstance(ws, cst.ParenthesizedWhitespace) else cst.SimpleWhitespace(" ")))
        args.append(arg.with_changes(comma=trailing))
    else:
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        args.append(arg)
    return call.with_changes(args=args)


def add_kwarg(call: cst.Call, name: str, value: str) -> cst.Call:
    """``call`` with ``name=value`` appended (``value`` an expression's text)."""
    arg = cst.Arg(
        keyword=cst.Name(name),
        value=cst.parse_expression(value),
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )
    return append_arg(call, arg)
