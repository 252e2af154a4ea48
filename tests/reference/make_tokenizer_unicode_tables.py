#!/usr/bin/env python3
"""Generate src/data/unicode_tables.c: the Unicode facts the CLIP tokenizer's clean-up and
pre-tokenisation need, taken from the reference environment itself.

The reference (doc/tokenizer.md) is transformers' slow CLIPTokenizer without ftfy on
Python 3.11, i.e. BasicTokenizer clean-up (unicodedata categories, NFC, str.split,
str.lower) followed by the `regex` module's pattern with \\p{L} / \\p{N} / \\s and
IGNORECASE.  Python's unicodedata and the regex module each carry their own Unicode
version, so the tables are probed from the very functions the reference calls rather
than read from UCD files:

  * per code point: which of the three regex classes [\\p{L}], [\\p{N}] and
    [^\\s\\p{L}\\p{N}] match it under IGNORECASE (a code point matched by none is
    skipped like whitespace: U+0345 is one), whether BasicTokenizer drops it
    (NUL, U+FFFD, categories C*) or turns it into a space (\\t \\n \\r, Zs), whether
    str.isspace() is true, and CPython's Cased / Case_Ignorable properties (probed
    through str.lower()'s final-sigma rule, the only place they matter);
  * str.lower()'s mapping (full mappings: U+0130 becomes two code points);
  * NFC: canonical combining classes, full canonical decompositions and the primary
    composites (Hangul syllables are algorithmic and not listed);
  * which code points the regex module matches, case-insensitively, for the ASCII letters
    of the pattern's literal alternatives ('s 't 're 've 'm 'll 'd and the two specials).

Before writing, the script re-implements NFC, lower() and the class split in plain Python
from the generated tables and checks them against unicodedata / str.lower / regex on all
code points and on random strings; it refuses to write tables that disagree.

How to run it (from the repository root; versions pinned in requirements-tokenizer.txt):

    python3.11 -m venv tests/reference/.venv
    tests/reference/.venv/bin/pip install -r tests/reference/requirements-tokenizer.txt
    tests/reference/.venv/bin/python tests/reference/make_tokenizer_unicode_tables.py

Add --check to compare with the committed file instead of writing it.
"""
import argparse
import os
import random
import sys
import unicodedata

import regex

EXPECTED_PYTHON = (3, 11)
EXPECTED_UNIDATA = "14.0.0"
EXPECTED_REGEX = "2026.5.9"

# property bits (keep in sync with src/data/unicode_tables.h)
P_RX_L = 1 << 0          # matched by [\p{L}] (IGNORECASE)
P_RX_N = 1 << 1          # matched by [\p{N}]
P_RX_O = 1 << 2          # matched by [^\s\p{L}\p{N}]
P_DROP = 1 << 3          # BasicTokenizer._clean_text removes it
P_CSPACE = 1 << 4        # BasicTokenizer._clean_text turns it into ' '
P_PYSPACE = 1 << 5       # str.isspace()
P_CASED = 1 << 6         # CPython Cased (only meaningful when not case-ignorable)
P_CASE_IGN = 1 << 7      # CPython Case_Ignorable
P_LOWER = 1 << 8         # str.lower() changes it (U+03A3 is context dependent)
P_NFC_MAYBE = 1 << 9     # NFC may change a string containing it
P_DECOMP = 1 << 10       # has a canonical decomposition (Hangul syllables excluded)

BLOCK = 128
MAX_CP = 0x110000
SURROGATES = range(0xD800, 0xE000)


def is_surrogate(cp):
    return 0xD800 <= cp <= 0xDFFF


def probe():
    ic = regex.IGNORECASE
    rx_l = regex.compile(r"[\p{L}]", ic)
    rx_n = regex.compile(r"[\p{N}]", ic)
    rx_o = regex.compile(r"[^\s\p{L}\p{N}]", ic)
    props = [0] * MAX_CP
    ccc = [0] * MAX_CP
    lower = {}
    decomp = {}
    for cp in range(MAX_CP):
        if is_surrogate(cp):
            continue
        c = chr(cp)
        p = 0
        if rx_l.fullmatch(c):
            p |= P_RX_L
        if rx_n.fullmatch(c):
            p |= P_RX_N
        if rx_o.fullmatch(c):
            p |= P_RX_O
        cat = unicodedata.category(c)
        if cp == 0 or cp == 0xFFFD or (cat[0] == "C" and c not in "\t\n\r"):
            p |= P_DROP
        elif c in " \t\n\r" or cat == "Zs":
            p |= P_CSPACE
        if c.isspace():
            p |= P_PYSPACE
        # final sigma probes: X = "c Σ" ends in ς  <=> not ignorable and cased
        #                     Y = "A c Σ" ends in ς <=> ignorable or cased
        x = (c + "\u03a3").lower()[-1] == "\u03c2"
        y = ("A" + c + "\u03a3").lower()[-1] == "\u03c2"
        if x:
            p |= P_CASED
        if y and not x:
            p |= P_CASE_IGN
        if cp == 0x3A3:
            p |= P_LOWER
        else:
            lo = c.lower()
            if lo != c:
                p |= P_LOWER
                lower[cp] = [ord(ch) for ch in lo]
        ccc[cp] = unicodedata.combining(c)
        if not (0xAC00 <= cp <= 0xD7A3):
            nfd = unicodedata.normalize("NFD", c)
            if nfd != c:
                decomp[cp] = [ord(ch) for ch in nfd]
                p |= P_DECOMP
        props[cp] = p
    comp = {}
    for cp in range(MAX_CP):
        if is_surrogate(cp) or 0xAC00 <= cp <= 0xD7A3:
            continue
        d = unicodedata.decomposition(chr(cp))
        if not d or d.startswith("<"):
            continue
        parts = [int(x, 16) for x in d.split()]
        if len(parts) == 2 and unicodedata.normalize("NFC", chr(cp)) == chr(cp):
            comp[(parts[0], parts[1])] = cp
    seconds = {b for (_, b) in comp}
    for cp in range(MAX_CP):
        if is_surrogate(cp):
            continue
        c = chr(cp)
        if (ccc[cp] != 0 or unicodedata.normalize("NFC", c) != c or cp in seconds
                or 0x1161 <= cp <= 0x1175 or 0x11A8 <= cp <= 0x11C2):
            props[cp] |= P_NFC_MAYBE
    fold = []
    for letter in "abcdefghijklmnopqrstuvwxyz":
        rx = regex.compile(regex.escape(letter), ic)
        for cp in range(MAX_CP):
            if not is_surrogate(cp) and rx.fullmatch(chr(cp)):
                fold.append((cp, letter))
    fold.sort()
    return props, ccc, lower, decomp, comp, fold


# ---- plain-Python re-implementations from the tables (mirrored by tokenizer.c) -----------

S_BASE, L_BASE, V_BASE, T_BASE = 0xAC00, 0x1100, 0x1161, 0x11A7
L_COUNT, V_COUNT, T_COUNT = 19, 21, 28
N_COUNT = V_COUNT * T_COUNT
S_COUNT = L_COUNT * N_COUNT


def nfc_from_tables(cps, props, ccc, decomp, comp):
    if not any(props[c] & P_NFC_MAYBE for c in cps):
        return list(cps)
    d = []
    for c in cps:
        if S_BASE <= c < S_BASE + S_COUNT:
            s = c - S_BASE
            d.append(L_BASE + s // N_COUNT)
            d.append(V_BASE + (s % N_COUNT) // T_COUNT)
            if s % T_COUNT:
                d.append(T_BASE + s % T_COUNT)
        elif props[c] & P_DECOMP:
            d.extend(decomp[c])
        else:
            d.append(c)
    # canonical ordering: stable sort of each run of non-starters by ccc
    i = 0
    while i < len(d):
        if ccc[d[i]] == 0:
            i += 1
            continue
        j = i
        while j < len(d) and ccc[d[j]] != 0:
            j += 1
        d[i:j] = sorted(d[i:j], key=lambda x: ccc[x])
        i = j
    # canonical composition: a character combines with the last starter unless a character
    # between them has combining class 0 or >= its own (after ordering, the last one decides)
    out = []
    starter = -1
    last_ccc = 0
    for c in d:
        cc = ccc[c]
        if starter >= 0 and (len(out) - 1 == starter or (last_ccc != 0 and last_ccc < cc)):
            s = out[starter]
            composed = None
            if L_BASE <= s < L_BASE + L_COUNT and V_BASE <= c < V_BASE + V_COUNT:
                composed = S_BASE + ((s - L_BASE) * V_COUNT + (c - V_BASE)) * T_COUNT
            elif (S_BASE <= s < S_BASE + S_COUNT and (s - S_BASE) % T_COUNT == 0
                  and T_BASE < c < T_BASE + T_COUNT):
                composed = s + (c - T_BASE)
            else:
                composed = comp.get((s, c))
            if composed is not None:
                out[starter] = composed
                continue
        if cc == 0:
            starter = len(out)
        last_ccc = cc
        out.append(c)
    return out


def lower_from_tables(cps, props, lower):
    out = []
    n = len(cps)
    for i, c in enumerate(cps):
        if c == 0x3A3:
            j = i - 1
            while j >= 0 and props[cps[j]] & P_CASE_IGN:
                j -= 1
            final = j >= 0 and bool(props[cps[j]] & P_CASED)
            if final:
                j = i + 1
                while j < n and props[cps[j]] & P_CASE_IGN:
                    j += 1
                final = j == n or not props[cps[j]] & P_CASED
            out.append(0x3C2 if final else 0x3C3)
        elif props[c] & P_LOWER:
            out.extend(lower[c])
        else:
            out.append(c)
    return out


def random_string(rng, pools):
    k = rng.randint(0, 12)
    cps = []
    for _ in range(k):
        pool = rng.choice(pools)
        cps.append(rng.choice(pool))
    return "".join(chr(c) for c in cps)


def verify(props, ccc, lower, decomp, comp):
    n_checked = 0
    for cp in range(MAX_CP):
        if is_surrogate(cp):
            continue
        c = chr(cp)
        got = nfc_from_tables([cp], props, ccc, decomp, comp)
        if got != [ord(x) for x in unicodedata.normalize("NFC", c)]:
            raise SystemExit(f"NFC mismatch for U+{cp:04X}")
        if cp != 0x3A3 and lower_from_tables([cp], props, lower) != [ord(x) for x in c.lower()]:
            raise SystemExit(f"lower mismatch for U+{cp:04X}")
        n_checked += 1
    rng = random.Random(20240601)
    combining = [cp for cp in range(MAX_CP) if not is_surrogate(cp) and ccc[cp]]
    starters_in_pairs = sorted({a for (a, _) in comp})
    seconds = sorted({b for (_, b) in comp})
    decomposable = sorted(decomp)
    hangul = list(range(0x1100, 0x1113)) + list(range(0x1161, 0x1176)) + list(range(0x11A8, 0x11C3)) + \
        [0xAC00, 0xAC01, 0xAC1C, 0xD7A3, 0xB098, 0xB099]
    greek = list(range(0x370, 0x400)) + [0x2E, 0x27, 0x20, 0x41, 0x61, 0x300, 0x301, 0x345, 0xAD, 0x2019]
    misc = list(range(0x20, 0x80)) + [0x130, 0x131, 0x17F, 0x1E9E, 0xDF, 0x212A, 0x2126, 0x3A3]
    pools = [combining, starters_in_pairs, seconds, decomposable, hangul, greek, misc]
    for _ in range(300000):
        s = random_string(rng, pools)
        cps = [ord(x) for x in s]
        if nfc_from_tables(cps, props, ccc, decomp, comp) != [ord(x) for x in unicodedata.normalize("NFC", s)]:
            raise SystemExit(f"NFC mismatch for {s!r}")
        if lower_from_tables(cps, props, lower) != [ord(x) for x in s.lower()]:
            raise SystemExit(f"lower mismatch for {s!r}")
    return n_checked


# ---- emitting C --------------------------------------------------------------------------

def two_stage(values, block):
    blocks = {}
    stage1 = []
    stage2 = []
    for start in range(0, MAX_CP, block):
        chunk = tuple(values[start:start + block])
        if chunk not in blocks:
            blocks[chunk] = len(stage2) // block
            stage2.extend(chunk)
        stage1.append(blocks[chunk])
    return stage1, stage2


def c_array(ctype, name, values, per_line=16, fmt="{}"):
    lines = [f"const {ctype} {name}[{len(values)}] = {{"]
    for i in range(0, len(values), per_line):
        lines.append("    " + ", ".join(fmt.format(v) for v in values[i:i + per_line]) + ",")
    lines.append("};")
    return "\n".join(lines)


def emit(props, ccc, lower, decomp, comp, fold):
    py = ".".join(str(x) for x in sys.version_info[:3])
    out = []
    out.append("/* Unicode tables for the CLIP tokenizer, generated by "
               "tests/reference/make_tokenizer_unicode_tables.py: do not edit. */")
    out.append(f"/* Source: Python {py} (unicodedata {unicodedata.unidata_version}), "
               f"regex {regex.__version__}. */")
    out.append('#include "unicode_tables.h"')
    out.append("")
    # surrogates never reach the tables (UTF-8 decoding rejects them); give them the
    # properties of an unassigned code point so that the table stays total
    vals = list(props)
    for cp in SURROGATES:
        vals[cp] = P_RX_O | P_DROP
    s1, s2 = two_stage(vals, BLOCK)
    out.append(c_array("uint16_t", "sd_uc_prop_stage1", s1, per_line=24))
    out.append(c_array("uint16_t", "sd_uc_prop_stage2", s2, per_line=24))
    c1, c2 = two_stage(ccc, BLOCK)
    out.append(c_array("uint16_t", "sd_uc_ccc_stage1", c1, per_line=24))
    out.append(c_array("uint8_t", "sd_uc_ccc_stage2", c2, per_line=24))
    # lower-case mappings: single code point ones in a sorted table, longer ones apart
    singles = sorted((cp, v[0]) for cp, v in lower.items() if len(v) == 1)
    multis = sorted((cp, v) for cp, v in lower.items() if len(v) > 1)
    out.append(f"const sd_uc_pair sd_uc_lower[{len(singles)}] = {{")
    for cp, v in singles:
        out.append(f"    {{0x{cp:04x}, 0x{v:04x}}},")
    out.append("};")
    out.append(f"const size_t sd_uc_n_lower = {len(singles)};")
    out.append(f"const sd_uc_multi sd_uc_lower_multi[{len(multis)}] = {{")
    for cp, v in multis:
        if len(v) > 3:
            raise SystemExit("lower-case mapping longer than 3 code points")
        padded = v + [0] * (3 - len(v))
        out.append(f"    {{0x{cp:04x}, {len(v)}, {{" + ", ".join(f"0x{x:04x}" for x in padded) + "}},")
    out.append("};")
    out.append(f"const size_t sd_uc_n_lower_multi = {len(multis)};")
    # decompositions
    pool = []
    entries = []
    for cp in sorted(decomp):
        d = decomp[cp]
        entries.append((cp, len(pool), len(d)))
        pool.extend(d)
    out.append(c_array("uint32_t", "sd_uc_decomp_pool", pool, per_line=10, fmt="0x{:04x}"))
    out.append(f"const sd_uc_decomp sd_uc_decomp_map[{len(entries)}] = {{")
    for cp, off, n in entries:
        out.append(f"    {{0x{cp:04x}, {off}, {n}}},")
    out.append("};")
    out.append(f"const size_t sd_uc_n_decomp = {len(entries)};")
    out.append(f"const sd_uc_comp sd_uc_comp_map[{len(comp)}] = {{")
    for (a, b), c in sorted(comp.items()):
        out.append(f"    {{0x{a:04x}, 0x{b:04x}, 0x{c:04x}}},")
    out.append("};")
    out.append(f"const size_t sd_uc_n_comp = {len(comp)};")
    out.append(f"const sd_uc_pair sd_uc_ascii_fold[{len(fold)}] = {{")
    for cp, letter in fold:
        out.append(f"    {{0x{cp:04x}, '{letter}'}},")
    out.append("};")
    out.append(f"const size_t sd_uc_n_ascii_fold = {len(fold)};")
    out.append("")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "src", "data",
                                                 "unicode_tables.c"))
    ap.add_argument("--check", action="store_true", help="compare with the committed file, write nothing")
    args = ap.parse_args()
    if sys.version_info[:2] != EXPECTED_PYTHON or unicodedata.unidata_version != EXPECTED_UNIDATA:
        raise SystemExit(f"needs Python {EXPECTED_PYTHON[0]}.{EXPECTED_PYTHON[1]} (unicodedata "
                         f"{EXPECTED_UNIDATA}), this is {sys.version.split()[0]} ({unicodedata.unidata_version})")
    if regex.__version__ != EXPECTED_REGEX:
        raise SystemExit(f"needs regex=={EXPECTED_REGEX}, this is {regex.__version__}")
    props, ccc, lower, decomp, comp, fold = probe()
    n = verify(props, ccc, lower, decomp, comp)
    text = emit(props, ccc, lower, decomp, comp, fold)
    print(f"verified NFC and lower() on {n} code points and 300000 random strings; "
          f"{len(lower)} lower mappings, {len(decomp)} decompositions, {len(comp)} compositions",
          file=sys.stderr)
    if args.check:
        with open(args.out, encoding="utf-8") as f:
            if f.read() != text:
                print(f"{args.out} differs from what this environment generates", file=sys.stderr)
                return 1
        print(f"{args.out} is up to date", file=sys.stderr)
        return 0
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {args.out} ({len(text)} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
