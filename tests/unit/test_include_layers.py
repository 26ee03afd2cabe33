"""The folder order of src/ (docs/ARCHITECTURE.md, the line starting 'Layers:'), enforced: a file in
folder F may include kiln.h, system headers and headers of F or of a folder earlier in the order;
folders joined by '|' are one level and may not include each other. A folder of src/ missing from
the order, or an include naming a folder that does not exist, is an error too (a new folder must be
placed). The check is also run once on a copy of src/ with a forbidden include added, and must fail
there: a checker that cannot fail checks nothing."""
import os
import re
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def read_order(doc):
    for line in open(doc, encoding='utf-8'):
        if line.startswith('Layers:'):
            levels = [lv.strip('` \n') for lv in line[len('Layers:'):].split('→')]
            return {folder: i for i, lv in enumerate(levels) for folder in lv.split('|')}
    raise SystemExit(f'{doc}: no line starting with "Layers:"')


def violations(src, rank):
    out = []
    folders = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    for d in folders:
        if d not in rank:
            out.append(f'src/{d}/: folder is not in the layer order of docs/ARCHITECTURE.md')
    for d in folders:
        for dirpath, _, files in os.walk(os.path.join(src, d)):
            for fn in sorted(files):
                if not fn.endswith(('.c', '.h')):
                    continue
                path = os.path.join(dirpath, fn)
                rel = os.path.relpath(path, os.path.dirname(src))
                text = open(path, encoding='utf-8', errors='replace').read()
                for n, line in enumerate(text.splitlines(), 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    inc = m.group(1)
                    if inc in ("kiln.h", "kiln_test.h"):
                        continue
                    if '/' not in inc:
                        out.append(f'{rel}:{n}: #include "{inc}" does not name its folder')
                        continue
                    to = inc.split('/')[0]
                    if to not in rank:
                        out.append(f'{rel}:{n}: #include "{inc}": folder {to}/ is not in the layer order')
                    elif d in rank and to != d and rank[to] >= rank[d]:
                        how = 'the same level' if rank[to] == rank[d] else 'a higher layer'
                        out.append(f'{rel}:{n}: #include "{inc}" goes to {how} ({d}/ may use only folders below it)')
    return out


def main():
    rank = read_order(os.path.join(ROOT, 'docs', 'ARCHITECTURE.md'))
    src = os.path.join(ROOT, 'src')
    bad = violations(src, rank)
    for b in bad:
        print('FAIL', b)
    # the checker must be able to fail: a copy of src/ with an upward and a sideways include
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, 'src')
        shutil.copytree(src, copy)
        with open(os.path.join(copy, 'base', 'status.c'), 'a') as f:
            f.write('\n#include "engine/scheduler.h"\n')
        with open(os.path.join(copy, 'eval', 'lm.c'), 'a') as f:
            f.write('\n#include "server/text.h"\n')
        found = violations(copy, rank)
        want = ['base/status.c', 'eval/lm.c']
        for w in want:
            if not any(w in v for v in found):
                print(f'FAIL the checker did not catch the injected include in {w}: {found}')
                bad.append('self-test')
    if bad:
        sys.exit(1)
    levels = {}
    for f, r in rank.items():
        levels.setdefault(r, []).append(f)
    n_files = sum(len([f for f in fs if f.endswith(('.c', '.h'))]) for _, _, fs in os.walk(src))
    print(f'ok: {n_files} files of src/ follow', ' → '.join('|'.join(levels[r]) for r in sorted(levels)))

if __name__ == '__main__':
    main()
