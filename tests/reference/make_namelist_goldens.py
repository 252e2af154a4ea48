#!/usr/bin/env python3
"""Regenerate the namelist parity goldens tests/namelist/valid/*.json with f90nml.

Each tests/namelist/valid/NAME.nml is read by f90nml (the reference Python reader
of Fortran namelists) and its result is written, as JSON, to NAME.json next to
it.  The C unit test tests/unit/test_namelist.c parses the same .nml files with
sdtrain's reader, converts the result to the same structure and compares the two.

How to run it (from the repository root):

    python3 -m venv tests/reference/.venv
    tests/reference/.venv/bin/pip install -r tests/reference/requirements-namelist.txt
    tests/reference/.venv/bin/python tests/reference/make_namelist_goldens.py

Add --check to compare the goldens with what f90nml produces now without writing
anything (exit status 1 when one differs or is missing).  Pass a corpus directory
as argument to use another one than tests/namelist next to this script.

JSON layout (what the C test's converter mimics):

  * the top level is an object with one member per group name (lower case);
    a group that appears more than once in the file becomes a list of objects,
    one per occurrence in file order (f90nml's "cogroups");
  * a group is an object with one member per variable (lower case);
  * a variable is a scalar when f90nml gives a scalar and a list when it gives a
    list; unset elements are null; integers, reals, logicals and strings keep
    their JSON types (reals always carry a '.' or an exponent, as Python writes
    floats with repr, so they are never confused with integers).

The parser runs with global_start_index = 1, so that "a(3) = 5" gives
[null, null, 5] (Fortran's default lower bound) instead of f90nml's default [5]
with a hidden start index of 3; everything else is f90nml's default behaviour.
f90nml warnings (for example values it drops after an indexed element) are
turned into errors: such a file does not belong in the valid corpus.

The output is deterministic: json.dump(..., indent=1, sort_keys=True) with floats
as Python writes them, and a final newline.
"""
import argparse
import json
import os
import sys
import warnings

import f90nml


def plain(value, where):
    """Converts f90nml values (Namelist, lists, scalars) to plain JSON-able Python values."""
    if isinstance(value, dict):
        raise ValueError('{0}: derived types are not part of the corpus'.format(where))
    if isinstance(value, list):
        return [plain(v, where) for v in value]
    if isinstance(value, complex):
        raise ValueError('{0}: complex values are not part of the corpus'.format(where))
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError('{0}: unexpected value type {1}'.format(where, type(value).__name__))


def group_dict(group, where):
    return {str(key): plain(group[key], '{0}.{1}'.format(where, key)) for key in group.keys()}


def read_reference(path):
    """Parses one .nml file with f90nml and returns the plain structure."""
    parser = f90nml.Parser()
    parser.global_start_index = 1
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        with open(path, encoding='utf-8') as fh:
            nml = parser.read(fh)
    out = {}
    for key in nml.keys():
        name = str(key)
        if name in out:
            continue
        value = nml[name]
        if isinstance(value, list):  # f90nml's Cogroup: the group appears several times
            out[name] = [group_dict(g, name) for g in value]
        else:
            out[name] = group_dict(value, name)
    return out


def render(data):
    return json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False,
                      allow_nan=False) + '\n'


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('corpus', nargs='?', default=os.path.normpath(os.path.join(here, '..', 'namelist')),
                    help='corpus directory holding valid/ (default: tests/namelist)')
    ap.add_argument('--check', action='store_true',
                    help='compare only; exit 1 when a golden is missing or differs')
    args = ap.parse_args()

    valid = os.path.join(args.corpus, 'valid')
    names = sorted(n for n in os.listdir(valid) if n.endswith('.nml'))
    if not names:
        sys.exit('no .nml files in {0}'.format(valid))
    stale = 0
    for name in names:
        src = os.path.join(valid, name)
        dst = src[:-len('.nml')] + '.json'
        text = render(read_reference(src))
        old = None
        if os.path.exists(dst):
            with open(dst, encoding='utf-8') as fh:
                old = fh.read()
        if old == text:
            continue
        stale += 1
        if args.check:
            print('{0}: {1}'.format(dst, 'missing' if old is None else 'differs'))
        else:
            with open(dst, 'w', encoding='utf-8', newline='\n') as fh:
                fh.write(text)
            print('wrote {0}'.format(dst))
    print('f90nml {0}: {1} cases, {2} {3}'.format(
        f90nml.__version__, len(names), stale, 'stale' if args.check else 'written'))
    return 1 if (args.check and stale) else 0


if __name__ == '__main__':
    sys.exit(main())
