"""Hoist function-local internal imports (course_utils' own modules) to module level where that changes nothing:
not in try/if, not a lesson-08 worker program, no clash with a module-level name or a local/parameter name."""
import ast, pathlib, re, sys

WORKERS = {"multiworker", "parameter_server", "model_parallel"}
SKIP_FILES = set(sys.argv[2:])


def internal(n):
    if isinstance(n, ast.ImportFrom):
        return n.level > 0 or (n.module or "").startswith("course_utils")
    return any(a.name.startswith("course_utils") for a in n.names)


def names_of(n):
    return [(a.asname or a.name).split(".")[0] for a in n.names]


def module_names(tree):
    out = set()
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in ast.walk(n):
                if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store):
                    out.add(t.id)
    return out


def local_names(fn):
    out = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    for n in ast.walk(fn):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n is not fn:
            out.add(n.name)
    return out


def top_import_key(n):
    return ast.unparse(n)


total = 0
for path in sorted(pathlib.Path(sys.argv[1]).rglob("*.py")):
    if str(path) in SKIP_FILES:
        continue
    src = path.read_text()
    tree = ast.parse(src)
    lines = src.splitlines(keepends=True)
    existing = {top_import_key(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))}
    mod_defs = module_names(tree)
    top_imported = set()
    for n in tree.body:
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            top_imported.update(names_of(n))
    remove, add = [], []
    funcs = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for fn in funcs:
        locals_ = local_names(fn)
        for stmt in fn.body:  # direct statements only
            if not isinstance(stmt, (ast.Import, ast.ImportFrom)) or not internal(stmt):
                continue
            if stmt.lineno != stmt.end_lineno:
                continue
            mods = [a.name for a in stmt.names] + ([stmt.module] if isinstance(stmt, ast.ImportFrom) and stmt.module else [])
            if any(m.split(".")[-1] in WORKERS for m in mods):
                continue
            nm = names_of(stmt)
            if any(x in mod_defs for x in nm) or any(x in locals_ and x not in nm for x in nm):
                continue
            # a name bound by the import also assigned elsewhere in the function: skip
            assigned = {t.id for t in ast.walk(fn) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
            if any(x in assigned for x in nm):
                continue
            # a name imported at top already bound to something else: skip
            key = top_import_key(stmt)
            if key not in existing and any(x in top_imported for x in nm):
                continue
            remove.append(stmt.lineno)
            if key not in existing:
                existing.add(key)
                top_imported.update(nm)
                add.append(key)
    if not remove:
        continue
    # drop the import line; and the blank line after it when it opened the body or stood between blank lines
    for ln in sorted(set(remove), reverse=True):
        i = ln - 1
        before = lines[i - 1].strip() if i > 0 else ""
        del lines[i]
        if i < len(lines) and lines[i].strip() == "" and (before == "" or before.endswith(":") or before.endswith('"""')
                                                          or before.startswith("import ") or before.startswith("from ")):
            if before.startswith(("import ", "from ")) and i + 1 < len(lines) and lines[i + 1].strip() == "":
                pass
            elif before.startswith(("import ", "from ")):
                pass  # keep the blank line between the remaining imports and the code
            else:
                del lines[i]
    # insert after the last top-level import
    new_tree_src = "".join(lines)
    t2 = ast.parse(new_tree_src)
    last = max((n.end_lineno for n in t2.body if isinstance(n, (ast.Import, ast.ImportFrom))), default=None)
    if last is None:
        doc_end = t2.body[0].end_lineno if t2.body and isinstance(t2.body[0], ast.Expr) else 0
        last = doc_end
    lines = new_tree_src.splitlines(keepends=True)
    merged = {}
    for a in sorted(add):
        m = re.match(r"from (\S+) import (.+)$", a)
        if m and " as " not in a:
            merged.setdefault(m.group(1), []).extend(x.strip() for x in m.group(2).split(","))
        else:
            merged[a] = None
    out_lines = []
    for k, v in merged.items():
        out_lines.append(k if v is None else f"from {k} import {', '.join(sorted(set(v)))}")
    lines[last:last] = [a + "\n" for a in out_lines]
    out = "".join(lines)
    ast.parse(out)
    path.write_text(out)
    total += len(remove)
    print(f"{path}: {len(remove)} hoisted, {len(add)} added")
print("total", total)
