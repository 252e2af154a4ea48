"""Pieces of the CUDA sources for the host emulations (tests/gpu/*_emulate.sh): a macro or the
top-level definitions of a name, copied as they are, so that what the emulation compiles is the
code the GPU runs."""
import re
import sys


def macro(lines, name):
    """The #define of `name` with its continuation lines."""
    for i, l in enumerate(lines):
        if re.match(r'#define %s\b' % name, l):
            out = [l]
            while out[-1].rstrip().endswith('\\'):
                i += 1
                out.append(lines[i])
            return out
    sys.exit('extract_kernels: macro %s not found' % name)


def definitions(lines, name):
    """Every top-level definition of `name` (with its template line), up to its closing brace."""
    found = []
    pat = re.compile(r'^(static |struct |union ).*\b%s\b *(\(|\{|$)' % name)
    for i, l in enumerate(lines):
        if not pat.match(l) or l.rstrip().endswith(';'):
            continue
        start = i - 1 if i > 0 and lines[i - 1].startswith('template') else i
        j = i
        while lines[j] not in ('}', '};'):
            j += 1
        found.append(lines[start:j + 1])
    if not found:
        sys.exit('extract_kernels: definition of %s not found' % name)
    return found
