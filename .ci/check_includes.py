#!/usr/bin/env python3
"""The layering rule: every include between tapegrad's folders goes one way; and the public API is exactly what is
installed: every header that the public headers reach is installed, nothing else is, and every internal header lives
in a detail/ folder (cuda/, the kernels' launchers, is internal as a whole but for settings.hpp). Exits 1 naming each
wrong-way include, each header missing from the install or installed without need, and each internal header outside
detail/.

usage: check_includes.py [source root]
       check_includes.py --planted   (shows that the check fails: on a copy of the tree with wrong-way includes planted)

Each library file belongs to the layer of its folder (a detail/ folder to its parent's); it may include its own layer
and the layers listed for it below, always as "tapegrad/<path>" (so that no user file of the same relative path can
stand in for it). Examples use the public headers only, as a user's program does. Tests and benchmarks may include
anything.
"""
import pathlib
import re
import shutil
import sys
import tempfile

# layer: the layers it may include besides itself (the README's layout table says what each holds)
ALLOWED = {
    'tensor/core': [],
    'tensor/gpu': ['tensor/core'],
    'tensor': ['tensor/core', 'tensor/gpu'],
    'tensor/io': ['tensor', 'tensor/core', 'tensor/gpu'],
    'tensor/dist': ['tensor', 'tensor/core', 'tensor/gpu'],
    'autodiff': ['tensor', 'tensor/core'],
    'cuda': ['tensor/core', 'tensor/gpu'],
    'ops': ['autodiff', 'tensor/dist', 'tensor/io', 'tensor', 'tensor/core', 'tensor/gpu', 'cuda'],
    'ops/nn': ['ops', 'autodiff', 'tensor/dist', 'tensor/io', 'tensor', 'tensor/core', 'tensor/gpu'],
    'ops/optim': ['ops/nn', 'ops', 'autodiff', 'tensor/dist', 'tensor/io', 'tensor', 'tensor/core', 'tensor/gpu', 'cuda'],
}
PUBLIC = {'tapegrad.hpp', 'gpu.hpp'}      # the API: may include anything
GENERATED = {'config.hpp', 'version.hpp'}  # made by meson.build; part of the bottom layer
SOURCES = ('.hpp', '.cpp', '.cu', '.cuh')
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
INSTALL = re.compile(r"install_headers\(([^)]*)\)")


def layer_of(path):
    """The layer of a path relative to the root (or of an include's path after tapegrad/), None outside them."""
    if path in GENERATED:
        return 'tensor/core'
    folder = str(pathlib.PurePosixPath(path).parent)
    for layer in sorted(ALLOWED, key=len, reverse=True):
        if folder == layer or folder.startswith(layer + '/'):
            return layer
    return None


def check(root):
    problems = []
    for file in sorted(root.rglob('*')):
        rel = file.relative_to(root).as_posix()
        if file.suffix not in SOURCES or rel.startswith(('build', '.')):
            continue
        layer = layer_of(rel)
        kind = 'public' if rel in PUBLIC else 'example' if rel.startswith('examples/') else layer
        if kind is None:
            continue  # tests, benchmarks
        for match in INCLUDE.finditer(file.read_text(encoding='utf-8')):
            quote, target = match.groups()
            line = file.read_text(encoding='utf-8').count('\n', 0, match.start()) + 1
            where = f'{rel}:{line}: #include {quote}{target}{">" if quote == "<" else quote}'
            if not target.startswith('tapegrad/'):
                if target.endswith('.inc'):
                    continue  # generated into the build folder beside the source that includes it
                if quote == '"' and kind != 'example':
                    problems.append(f'{where}: a tapegrad header is included as "tapegrad/<path>"')
                elif quote == '"' and not (root / 'examples' / target).exists():
                    problems.append(f'{where}: not a file of examples/')
                continue
            inner = target[len('tapegrad/'):]
            if not ((root / inner).exists() or inner in GENERATED):
                problems.append(f'{where}: no such header')
            elif kind == 'example':
                if inner not in PUBLIC | GENERATED:
                    problems.append(f'{where}: examples use the public headers only ({", ".join(sorted(PUBLIC))})')
            elif kind != 'public':
                to = layer_of(inner)
                if inner in PUBLIC or (to != kind and to not in ALLOWED[kind]):
                    problems.append(f'{where}: layer {kind} may not include layer {to or inner}')
    return problems


def installed(root):
    """The headers that meson.build files install, as paths relative to the root."""
    names = set()
    for build in root.rglob('meson.build'):
        if build.relative_to(root).as_posix().startswith(('build', '.', 'tests', 'subprojects')):
            continue
        for match in INSTALL.finditer(build.read_text(encoding='utf-8')):
            listed, _, subdir = match.group(1).partition('subdir:')
            folder = subdir.strip().strip("'").removeprefix('tapegrad').strip('/')
            names.update(str(pathlib.PurePosixPath(folder) / pathlib.PurePosixPath(name).name)
                         for name in re.findall(r"'([^']+)'", listed))
    return names


def reached_from_public(root):
    """The headers that the public ones include, directly or not (them too)."""
    reached, todo = set(), sorted(PUBLIC)
    while todo:
        header = todo.pop()
        if header in reached or header in GENERATED or not (root / header).exists():
            continue
        reached.add(header)
        todo += [t[len('tapegrad/'):] for _, t in INCLUDE.findall((root / header).read_text(encoding='utf-8'))
                 if t.startswith('tapegrad/')]
    return reached


def install_problems(root):
    """Headers reached from the public ones but not installed, installed without being reached, and internal headers
    (not installed) outside a detail/ folder."""
    reached, listed = reached_from_public(root), installed(root)
    problems = [f'{h}: reached from the public headers but not installed (install_headers in its meson.build)'
                for h in sorted(reached - listed)]
    problems += [f'{h}: installed but no public header reaches it (an internal header is not installed)'
                 for h in sorted(listed - reached - PUBLIC)]
    for file in sorted(root.rglob('*')):
        rel = file.relative_to(root).as_posix()
        if file.suffix not in ('.hpp', '.cuh') or rel in PUBLIC or layer_of(rel) in (None, 'cuda'):
            continue
        if rel not in listed and '/detail/' not in f'/{rel}':
            problems.append(f'{rel}: internal (not installed) but outside a detail/ folder')
    return problems


# Includes that break the rule, each planted in a file of a lower layer (or an example) of a copy of the tree; and
# headers that break the install rule: an internal one outside detail/, and an internal one that a public one reaches.
PLANTED = {
    'tensor/tensor.hpp': '#include "tapegrad/autodiff/var.hpp"',
    'autodiff/var.cpp': '#include "tapegrad/cuda/elementwise.hpp"',
    'cuda/norm.hpp': '#include "tapegrad/ops/norm.hpp"',
    'tensor/core/error.hpp': '#include "tensor/core/device.hpp"',
    'examples/demo.cpp': '#include <tapegrad/ops/matmul.hpp>',
    'ops/planted.hpp': '#pragma once',
    'ops/reduce.hpp': '#include "tapegrad/ops/detail/axes.hpp"',
}


def planted(root):
    """The check on a copy of the tree with PLANTED added: each must be reported."""
    with tempfile.TemporaryDirectory() as copy:
        for folder in ('tensor', 'autodiff', 'cuda', 'ops', 'examples'):
            shutil.copytree(root / folder, pathlib.Path(copy) / folder)
        for name in PUBLIC:
            shutil.copy(root / name, pathlib.Path(copy) / name)
        for file, line in PLANTED.items():
            with open(pathlib.Path(copy) / file, 'a', encoding='utf-8') as f:
                f.write(line + '\n')
        shutil.copy(root / 'meson.build', pathlib.Path(copy) / 'meson.build')
        problems = check(pathlib.Path(copy)) + install_problems(pathlib.Path(copy))
    reports = {'ops/planted.hpp': 'ops/planted.hpp: internal', 'ops/reduce.hpp': 'ops/detail/axes.hpp: reached'}
    missed = [f'{file}: {line}' for file, line in PLANTED.items()
              if not any(p.startswith(reports[file]) if file in reports else
                         p.startswith(file + ':') and line.split()[1] in p for p in problems)]
    for m in missed:
        print(f'check_includes --planted: not reported: {m}')
    print(f'check_includes --planted: {len(PLANTED) - len(missed)} of {len(PLANTED)} planted includes reported')
    return not missed


if __name__ == '__main__':
    here = pathlib.Path(__file__).resolve().parent.parent
    if sys.argv[1:] == ['--planted']:
        sys.exit(0 if planted(here) else 1)
    root = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else here
    problems = check(root)
    misplaced = install_problems(root)
    for p in problems + misplaced:
        print(p)
    print(f'check_includes: {len(problems)} wrong-way include(s)' if problems else
          'check_includes: every include goes one way')
    print(f'check_includes: {len(misplaced)} header(s) installed or placed against the rule' if misplaced else
          'check_includes: exactly the headers the public ones reach are installed; internal ones are in detail/')
    sys.exit(1 if problems or misplaced else 0)
