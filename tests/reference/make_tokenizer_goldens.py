#!/usr/bin/env python3
"""Regenerate the CLIP tokenizer goldens under tests/data/tokenizer/ with the reference tokenizer.

The reference is what the seed pipeline ran (anyscale/templates stable-diffusion-pretraining,
sd_data_transforms.py): transformers' slow CLIPTokenizer, transformers 4.47.0, Python 3.11,
*without* ftfy (the template's lock file does not install it, so CLIPTokenizer falls back to
its BERT BasicTokenizer clean-up), called as
    tokenizer(text, padding="max_length", max_length=77, truncation=True)
with SD2's tokenizer files (pad token "!", id 0).  See doc/tokenizer.md.

What it writes (all deterministic: fixed seeds, gzip mtime 0):

  sd2-base/vocab.json.gz, sd2-base/merges.txt.gz, sd2-base/special_tokens_map.json,
  sd2-base/tokenizer_config.json
      the SD2 tokenizer folder, rebuilt from bpe_simple_vocab_16e6.txt.gz exactly as the
      CLIP vocab.json was derived (spec section 4.1) and with SD2's special-token settings;
      the Hub files themselves cannot be fetched here (doc/tokenizer.md says what was
      checked).  The C test gunzips the two big files into a temporary snapshot.
  golden.tsv
      one caption per line: escaped caption <TAB> the 77 ids <TAB> the length before
      truncation (len(tokenizer(text).input_ids), bos and eos included).  Captions given as
      bytes (ill-formed UTF-8) are decoded with errors='replace' first, as sdtrain documents.
  clean.tsv
      escaped input <TAB> escaped result of the reference's clean-up
      (" ".join(BasicTokenizer(strip_accents=False, do_split_on_punc=False).tokenize(text)))
      for the golden captions and a few thousand Unicode stress strings.

Escapes (both files, also understood by `sdtool tokenize --escaped`): \\\\ \\t \\n \\r and
\\xHH for one byte; control, format and separator characters other than the plain space are
always written as \\xHH bytes so the files stay readable; a leading '#' is written \\x23
(lines starting with '#' are comments).

How to run it (from the repository root):

    python3.11 -m venv tests/reference/.venv
    tests/reference/.venv/bin/pip install -r tests/reference/requirements-tokenizer.txt
    tests/reference/.venv/bin/python tests/reference/make_tokenizer_goldens.py

--check compares with the committed files instead of writing.  --fetch-bpe takes
bpe_simple_vocab_16e6.txt.gz from the open-clip-torch wheel on PyPI (pip download) instead
of the committed copy.  --check-command "CMD" runs a large randomized parity check (and
with --exhaustive every code point in context) against a command that behaves like
`sdtool tokenize --vocab FILE --escaped --count --file -`, e.g.

    --check-command "build/cpu/sdtool tokenize --vocab tests/data/tokenizer/bpe_simple_vocab_16e6.txt.gz"
"""
import argparse
import gzip
import hashlib
import importlib.util
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unicodedata
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.normpath(os.path.join(HERE, "..", "data", "tokenizer"))
BPE_NAME = "bpe_simple_vocab_16e6.txt.gz"
BPE_SHA256 = "924691ac288e54409236115652ad4aa250f48203de50a9e4722a6ecd48d6804a"
OPEN_CLIP = "open-clip-torch==3.3.0"
SEED = 20240917


def check_environment():
    import regex
    import transformers
    problems = []
    if sys.version_info[:2] != (3, 11):
        problems.append(f"Python 3.11 needed (unicodedata 14.0.0), this is {sys.version.split()[0]}")
    if transformers.__version__ != "4.47.0":
        problems.append(f"transformers==4.47.0 needed, found {transformers.__version__}")
    if regex.__version__ != "2026.5.9":
        problems.append(f"regex==2026.5.9 needed, found {regex.__version__}")
    if importlib.util.find_spec("ftfy") is not None:
        problems.append("ftfy is importable: the reference environment has no ftfy (pip uninstall ftfy)")
    if problems:
        raise SystemExit("wrong environment:\n  " + "\n  ".join(problems))


# ---- the SD2 tokenizer folder ---------------------------------------------------------------

def bytes_to_unicode_values():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def build_sd2_files(bpe_bytes):
    lines = gzip.decompress(bpe_bytes).decode("utf-8").split("\n")
    merges = lines[1:49152 - 256 - 2 + 1]
    alphabet = bytes_to_unicode_values()
    vocab = alphabet + [c + "</w>" for c in alphabet]
    vocab += ["".join(m.split()) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    encoder = dict(zip(vocab, range(len(vocab))))
    if len(encoder) != 49408:
        raise SystemExit(f"derived vocabulary has {len(encoder)} entries, expected 49408")
    vocab_json = json.dumps(encoder, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    merges_txt = ("#version: 0.2\n" + "\n".join(merges) + "\n").encode("utf-8")

    def tok(content):
        return {"content": content, "lstrip": False, "normalized": True, "rstrip": False, "single_word": False}
    # special_tokens_map.json: pad "!" on line 16, as in stabilityai/stable-diffusion-2-base
    special = {"bos_token": tok("<|startoftext|>"), "eos_token": tok("<|endoftext|>"), "pad_token": "!",
               "unk_token": tok("<|endoftext|>")}
    config = {"add_prefix_space": False,
              "bos_token": dict(__type="AddedToken", **tok("<|startoftext|>")),
              "do_lower_case": True,
              "eos_token": dict(__type="AddedToken", **tok("<|endoftext|>")),
              "errors": "replace", "model_max_length": 77,
              "name_or_path": "stabilityai/stable-diffusion-2-base",
              "pad_token": "<|endoftext|>", "special_tokens_map_file": "./special_tokens_map.json",
              "tokenizer_class": "CLIPTokenizer",
              "unk_token": dict(__type="AddedToken", **tok("<|endoftext|>"))}
    return {
        "vocab.json": vocab_json,
        "merges.txt": merges_txt,
        "special_tokens_map.json": (json.dumps(special, indent=2) + "\n").encode(),
        "tokenizer_config.json": (json.dumps(config, indent=2) + "\n").encode(),
    }


def gzip_bytes(data):
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as f:
        f.write(data)
    return buf.getvalue()


# ---- escaping ------------------------------------------------------------------------------

def escape(caption):
    out = []
    if isinstance(caption, bytes):
        for i, b in enumerate(caption):
            if b == 0x5C:
                out.append("\\\\")
            elif b == 0x09:
                out.append("\\t")
            elif b == 0x0A:
                out.append("\\n")
            elif b == 0x0D:
                out.append("\\r")
            elif 0x20 <= b < 0x7F and not (i == 0 and b == 0x23):
                out.append(chr(b))
            else:
                out.append(f"\\x{b:02X}")
        return "".join(out)
    for i, ch in enumerate(caption):
        if ch == "\\":
            out.append("\\\\")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif (ch != " " and unicodedata.category(ch)[0] in "CZ") or (i == 0 and ch == "#"):
            out.append("".join(f"\\x{b:02X}" for b in ch.encode("utf-8", "surrogatepass")))
        else:
            out.append(ch)
    return "".join(out)


# ---- captions --------------------------------------------------------------------------------

HAND = [
    # spec 4.7 vectors and framing
    "a photo of a cat", "a photo of a dog", "A PHOTO of  a Cat!", "Hello, world!", "", " ", "\t\n \r ",
    "!", "! !! !!!", "wow!!!", "a!b", "!?", "?!", "hey!? what?!", "¡hola!",
    # added tokens and the regex specials
    "<|startoftext|>", "<|endoftext|>", "a<|endoftext|>b", "<|startoftext|>a photo<|endoftext|>",
    "<|ENDOFTEXT|>", "<|EndOfText|> and <|STARTOFTEXT|>", "<|start\u200boftext|>", "<|endof text|>",
    "<|ſtartoftext|>", "<<|endoftext|>", "x<|endoftext", "<|startoftext|><|startoftext|>",
    # apostrophes
    "it's", "don't", "they're", "we've", "I'm", "we'll", "he'd", "IT'S", "DON'T", "THEY'RE", "WE'VE",
    "I'M", "WE'LL", "HE'D", "'s 't 're 've 'm 'll 'd", "''s", "'sa", "a'ſ b", "rock'n'roll",
    "o'clock", "the dog's bone", "the dogs' bones", "‘quoted’ and “double” it’s", "l'été", "'",
    # case
    "ALL CAPS CAPTION OF A RED CAR", "MiXeD CaSe WoRdS", "İstanbul", "ISTANBUL", "ıi İI", "STRASSE Straße ẞ",
    "ΣΊΣΥΦΟΣ", "ΟΔΟΣ ΣΑ Σ", "ΑΣ.", "Σ", "ΣΑΣ's", "aΣ", "aΣb", "a\u0301Σ", "ǅemal ǈ ǋ", "Kelvin \u212a",
    "Ohm \u2126", "ﬁ ﬂ ﬀ", "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３", "ǰ ΐ ﬓ",
    # accents, NFC, combining marks
    "café", "cafe\u0301", "Café Crème", "naïve résumé", "Ångström", "A\u030angstro\u0308m",
    "e\u0301\u0301", "a\u0323\u0302", "a\u0302\u0323", "q\u0307\u0323", "\u0301abc", "x\u0345",
    "ᾳ α\u0345 Α\u0345", "\u1100\u1161\u11a8", "\u1100\u1161 \u11a8", "한국어 텍스트", "\uac00\u11a8",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354LG\u0358O",
    "\u212b \u2126 \u037e \u0387 \u1fef \u0340", "\u0958\u0959 क़", "\u0f73 \u0f75 \u0f81",
    # runs of more than 32 marks (sdtrain sorts those by counting, shorter ones by insertion)
    "a" + "\u0301\u0316" * 40, "o" + "\u0323\u0302\u031b\u0345" * 20 + "x",
    "\u05d0" + "\u05b9\u05b0\u05c1\u05bc" * 12 + " " + "e" + "\u0301" * 33 + "\u0323",
    # CJK and other scripts
    "中文字幕", "日本語のテキスト、東京タワー", "漢字とかなカナ", "𠀀𠀁 𪜀 \U0002b740 \U0002b820", "\uf900\ufa0e",
    "北京 2008 奥运会", "ＣＪＫ　全角スペース", "Русский текст, Москва", "Ελληνικά και Αθήνα", "العربية مَرْحَبًا",
    "עברית שָׁלוֹם", "हिन्दी देवनागरी क्षत्रिय", "தமிழ்", "ภาษาไทย", "ქართული", "Հայերեն", "አማርኛ",
    "Tiếng Việt có dấu", "한국어", "ᄀᄁ ᆨᆩ", "𝐀𝐁𝐂 𝒜𝒷𝒸 𝟘𝟙𝟚", "Ⅻ ⅻ ① ½ ٣ ४ ௰ 〇",
    # emoji
    "😀", "I ❤️ NY", "👍🏽 nice", "👨‍👩‍👧‍👦 family", "🏳️‍🌈", "🇺🇸🇫🇷 flags", "1️⃣ #️⃣", "🫠 melting",
    "🫨 shaking (new in Unicode 15)", "party 🎉🎉🎉!!!", "☕️☕", "©®™",
    # HTML entities, markup, URLs
    "Tom &amp; Jerry", "&quot;quoted&quot;", "it&#39;s", "&lt;b&gt;bold&lt;/b&gt;", "<b>bold</b> <i>it</i>",
    "&nbsp;space&nbsp;", "https://www.example.com/path/to/image.jpg?w=1024&h=768#frag",
    "http://t.co/AbC123", "www.shop-online.co.uk", "user@example.com", "C:\\Users\\me\\Pictures\\img.png",
    # numbers and punctuation
    "1234567890", "3.14159", "$19.99", "1,000,000", "1920x1080", "2021-03-04", "12:30 PM", "50%", "#1",
    "...", "…", "---", "!!!???...", "(((parens)))", "[tag] {brace}", "a.b.c", "x--y", "~~~ *** ___",
    "@user #hashtag #AnotherOne", "\"quotes\" 'single'", "«guillemets» „low“", "·•●",
    # whitespace and invisible characters
    "tab\tseparated\twords", "new\nline", "crlf\r\nline", "a\x0bb\x0cc", "nbsp\u00a0here", "ideo\u3000space",
    "line\u2028sep\u2029para", "zero\u200bwidth", "zw\u200cnj\u200dzwj", "bom\ufeffhere", "soft\u00adhyphen",
    "ltr\u200emark\u200f", "word\u2060joiner", "mongolian\u180evs", "nel\x85here", "null\x00byte",
    "ctrl\x01\x02\x03\x1f\x7f", "esc\x1b[31mred\x1b[0m", "\u00a0\u00a0lead and trail\u2003\u2003",
    "private\ue000use\U000f0000", "unassigned\u0378\U0001fae9", "replacement \ufffd char", "noncharacter\ufdd0\uffff",
    "half\u3000width\uff61\uff64", "\u3000", "\u2028", "  multiple   spaces   ",
]


def invalid_utf8_cases():
    return [
        b"caf\xe9", b"\xff\xfe", b"abc\x80def", b"\xc3", b"\xc3(", b"\xe2\x82", b"\xe2\x82a", b"\xe2\x28\xa1",
        b"\xf0\x90\x80", b"\xf0\x90\x80\xff", b"\xf0\x28\x8c\x28", b"\xc0\xaf", b"\xe0\x80\xaf",
        b"\xed\xa0\x80", b"\xed\xbf\xbf x", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xfe\xff",
        b"a\xe2!b", b"!\x80!", b"hello \xe4\xb8 world", b"\xe4\xb8\xad\xe6\x96", b"<|endoftext\xff|>",
        b"<|endoftext|>\xff", b"it\x92s", b"\x93smart quotes\x94", b"\xc2\xa0nbsp ok \xc2", b"\xef\xbf\xbd ok",
        b"\xef\xbb\xbfbom", b"\xe2\x80\x8b\x80", b"\x80" * 10, b"\xf0\x9f\x98", b"\xf0\x9f\x98\x80\xf0\x9f",
        b"multi \xc3\xa9\xe9 mix", b"\xce\xa3\xff", "ΑΣ".encode() + b"\xff",
        b"\x00\xff\x00",
    ]


WORDS = ("the of and a to in is you that it he was for on are as with his they at be this have from or one "
         "had by word but not what all were we when your can said there use an each which she do how their "
         "if will up other about out many then them these so some her would make like him into time has look "
         "two more write go see number no way could people my than first water been call who oil its now find "
         "long down day did get come made may part beautiful sunset beach mountain forest portrait woman man "
         "girl boy dog cat house kitchen interior design modern vintage retro minimalist abstract painting "
         "watercolor illustration vector logo icon poster wallpaper background texture pattern flower garden "
         "wedding dress shoes leather bag jacket sneakers table chair sofa lamp bedroom bathroom living room "
         "city skyline night street car motorcycle bicycle airplane train boat ocean river lake sky clouds "
         "snow winter summer autumn spring christmas halloween birthday party cake food pizza burger coffee "
         "tea wine beer fruit apple banana strawberry chocolate dessert salad healthy organic fresh delicious "
         "stock photo image picture free download royalty high resolution quality closeup aerial view "
         "black white red blue green yellow orange purple pink brown gray golden silver wooden metal glass "
         "cute funny happy smiling young old senior baby family friends couple business office computer "
         "laptop phone iphone samsung galaxy nike adidas ikea amazon ebay etsy pinterest shutterstock").split()
SITES = ["example.com", "shutterstock.com", "flickr.com", "pinterest.com", "etsy.com", "amazon.de",
         "alamy.com", "wikimedia.org", "i.imgur.com", "cdn.shopify.com"]
NAMES = ["John Smith", "María García", "李伟", "Иван Петров", "Zoë Ødegård", "Jean-Luc Picard", "O'Brien",
         "Ng Wen-Jie", "Ahmed Al-Farsi", "Björk"]
CITIES = ["Paris", "München", "São Paulo", "Zürich", "Kraków", "Reykjavík", "東京", "서울", "Москва", "القاهرة",
          "Αθήνα", "New York", "Ciudad de México", "İzmir", "Hà Nội"]
EMOJI = ["😀", "😍", "🔥", "✨", "❤️", "👍", "🎉", "🌸", "🐶", "🍕", "☀️", "🇯🇵", "👩‍💻", "💯"]
FOREIGN = ["Schöne Aussicht über die Alpen", "Café de Flore à Paris", "东京塔的夜景", "東京タワーの夜景",
           "서울의 야경 사진", "Москва ночью зимой", "منظر غروب الشمس", "नमस्ते भारत की तस्वीर",
           "Ελληνικό νησί στο Αιγαίο", "İstanbul'da gün batımı", "Ñandú en la pampa", "Žluťoučký kůň",
           "Łódź Świętokrzyska", "Þingvellir þjóðgarður", "Việt Nam quê hương", "ประเทศไทย ทะเล"]


def laion_caption(rng):
    w = lambda k: " ".join(rng.choice(WORDS) for _ in range(k))
    num = lambda: str(rng.randint(0, 99999))
    t = rng.randint(0, 27)
    if t == 0:
        s = f"{w(rng.randint(2, 12))}"
    elif t == 1:
        s = f"{w(3).title()} - Stock Photo"
    elif t == 2:
        s = f"IMG_{rng.randint(0, 9999):04d}.JPG"
    elif t == 3:
        s = f"{w(4)} | {rng.choice(SITES)}"
    elif t == 4:
        s = f"Buy {w(2)} for ${rng.randint(1, 999)}.{rng.randint(0, 99):02d} - Free Shipping!"
    elif t == 5:
        s = f"{w(3)} #{rng.choice(WORDS)} #{rng.choice(WORDS)}{rng.choice(WORDS)} @{rng.choice(WORDS)}_{num()}"
    elif t == 6:
        s = f"\"{w(5).capitalize()}\" by {rng.choice(NAMES)}, {rng.randint(1850, 2023)}, oil on canvas, " \
            f"{rng.randint(10, 200)} x {rng.randint(10, 200)} cm"
    elif t == 7:
        s = f"{w(3)} ({rng.randint(1, 9)}/{rng.randint(9, 20)})"
    elif t == 8:
        s = f"Photo by {rng.choice(NAMES)} on Unsplash"
    elif t == 9:
        s = f"https://www.{rng.choice(SITES)}/{rng.choice(WORDS)}/{num()}?id={num()}&size=large"
    elif t == 10:
        s = f"<b>{w(3)}</b> &amp; {w(2)} &quot;{w(1)}&quot;"
    elif t == 11:
        s = f"{rng.randint(1, 6)} bedroom house for sale in {rng.choice(CITIES)}"
    elif t == 12:
        s = rng.choice(FOREIGN)
    elif t == 13:
        s = f"{w(4)} {rng.choice(EMOJI)}{rng.choice(EMOJI)}"
    elif t == 14:
        s = f"{w(2).upper()}!!! {w(3)}?!"
    elif t == 15:
        s = f"{rng.randint(1, 4000)}x{rng.randint(1, 4000)} {w(3)} wallpaper HD 4K"
    elif t == 16:
        s = f"{w(3)}, {w(2)}; {w(2)}: {w(1)}..."
    elif t == 17:
        s = f"{rng.choice(NAMES)}'s {w(2)} isn't {w(1)}, they're {w(1)} and we'll see"
    elif t == 18:
        s = f"{w(2)} {rng.choice(CITIES)} {rng.randint(1990, 2024)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    elif t == 19:
        s = f"{w(rng.randint(30, 70))}"  # long: truncation
    elif t == 20:
        s = f"{w(3)}\t{w(2)}\n{w(2)}"
    elif t == 21:
        s = f"  {w(2)}   {w(3)}  "
    elif t == 22:
        s = f"{w(3)} ™ © ® ° ± × ÷ € £ ¥ §"
    elif t == 23:
        s = f"Product {num()}-{rng.choice('ABCDEFGH')}{rng.randint(0, 99)} {w(2)} v{rng.randint(1, 9)}.{rng.randint(0, 9)}"
    elif t == 24:
        s = f"{w(2)} – {w(2)} — {w(2)} “{w(2)}” ‘{w(1)}’"
    elif t == 25:
        s = f"{rng.choice(FOREIGN)} {w(2)} {rng.choice(EMOJI)}"
    elif t == 26:
        s = f"{w(2)}&nbsp;{w(2)}&#8217;s {w(1)}&#x27;"
    else:
        s = f"{w(1).upper()} {w(2).title()} {num()} {w(1)}!"
    r = rng.random()
    if r < 0.08:
        s = s.upper()
    elif r < 0.16:
        s = s.title()
    elif r < 0.2:
        s = s.replace(" ", "  ")
    return s


def unicode_pools(rng):
    pools = {
        "ascii": [c for c in range(0x20, 0x7F)],
        "latin": list(range(0xC0, 0x250)),
        "combining": list(range(0x300, 0x370)) + list(range(0x1AB0, 0x1ACF)) + list(range(0x20D0, 0x20F1)),
        "greek": list(range(0x370, 0x400)) + list(range(0x1F00, 0x2000)),
        "cyrillic": list(range(0x400, 0x530)),
        "hebrew_arabic": list(range(0x590, 0x700)),
        "indic": list(range(0x900, 0xD80)),
        "thai_tibetan": list(range(0xE00, 0x1000)),
        "hangul": list(range(0x1100, 0x1200)) + [rng.randint(0xAC00, 0xD7A3) for _ in range(200)],
        "cjk": [rng.randint(0x4E00, 0x9FFF) for _ in range(200)] + list(range(0x3000, 0x3100)) +
               list(range(0xF900, 0xFB00)) + [rng.randint(0x20000, 0x2FA1F) for _ in range(100)],
        "fullwidth": list(range(0xFF00, 0xFFF0)),
        "punct_sym": list(range(0x2000, 0x2BFF)),
        "emoji": list(range(0x1F300, 0x1FB00)) + [0x200D, 0xFE0F, 0x20E3],
        "format_space": [0xAD, 0x600, 0x61C, 0x180E, 0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x2028, 0x2029,
                         0x202A, 0x202F, 0x205F, 0x2060, 0x2066, 0xFEFF, 0xA0, 0x1680, 0x3000, 0x85, 0x0B, 0x0C,
                         0x1C, 0x1D, 0x1E, 0x1F, 0x09, 0x0A, 0x0D, 0x20, 0x20, 0x20],
        "special": [0x3A3, 0x3C3, 0x3C2, 0x130, 0x131, 0x17F, 0x345, 0x27, 0x21, 0x3C, 0x7C, 0x3E, 0x1E9E, 0xDF,
                    0x212A, 0x2126, 0x212B, 0xFFFD, 0],
        "supplementary": [rng.randint(0x10000, 0x1FFFF) for _ in range(300)] + list(range(0x1D400, 0x1D800)),
        "anywhere": [c for c in (rng.randint(0, 0x10FFFF) for _ in range(2000)) if not 0xD800 <= c <= 0xDFFF],
    }
    return pools


def stress_string(rng, pools, max_len=24):
    names = list(pools)
    n = rng.randint(1, max_len)
    weights = [3 if k in ("ascii", "combining", "special", "format_space") else 1 for k in names]
    out = []
    for _ in range(n):
        pool = pools[rng.choices(names, weights)[0]]
        out.append(chr(rng.choice(pool)))
    return "".join(out)


def long_words(rng):
    words = [w for w in WORDS if w.isalpha()]
    out = []
    for n in (16, 30, 60, 120, 400):
        out.append("".join(rng.choice(words) for _ in range(n)))
    out.append("ab" * 300)
    out.append("a" * 1000)
    out.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(700)))
    out.append("é" * 80 + "ß" * 40)
    out.append("😀" * 40)
    out.append("." * 300 + "x")
    out.append("-=" * 200)
    out.append("supercalifragilisticexpialidocious" * 10)
    out.append("Antidisestablishmentarianism " * 30)
    out.append("0123456789" * 30)
    out.append("中" * 200)
    out.append("ΑΒΓΔΕ" * 60 + "Σ")
    out.append("http://" + "".join(rng.choice(words) for _ in range(50)) + ".com")
    for _ in range(12):
        k = rng.randint(65, 1500)
        out.append("".join(rng.choice("aeioulnrstdmkbp") for _ in range(k)))
    return out


def make_captions():
    rng = random.Random(SEED)
    captions = list(HAND) + invalid_utf8_cases() + long_words(rng)
    for _ in range(650):
        captions.append(laion_caption(rng))
    pools = unicode_pools(rng)
    for _ in range(250):
        captions.append(stress_string(rng, pools))
    for _ in range(40):  # mixtures of realistic text and stress characters
        captions.append(laion_caption(rng) + " " + stress_string(rng, pools, 8) + " " + laion_caption(rng))
    return captions, pools, rng


# ---- the reference -----------------------------------------------------------------------

def reference_tokenizer(folder):
    import transformers
    from transformers import CLIPTokenizer
    transformers.logging.set_verbosity_error()
    tok = CLIPTokenizer.from_pretrained(folder)
    if tok.fix_text is not None:
        raise SystemExit("CLIPTokenizer is using ftfy; the reference must not")
    if tok.pad_token != "!" or tok.pad_token_id != 0 or tok.bos_token_id != 49406 or tok.eos_token_id != 49407:
        raise SystemExit(f"unexpected special tokens: pad {tok.pad_token!r}={tok.pad_token_id}, "
                         f"bos {tok.bos_token_id}, eos {tok.eos_token_id}")
    return tok


def as_text(caption):
    return caption.decode("utf-8", "replace") if isinstance(caption, bytes) else caption


def reference_ids(tok, caption):
    text = as_text(caption)
    ids = tok(text, padding="max_length", max_length=77, truncation=True)["input_ids"]
    n = len(tok(text)["input_ids"])
    if len(ids) != 77:
        raise SystemExit(f"reference gave {len(ids)} ids for {caption!r}")
    return ids, n


def reference_clean(tok, caption):
    return " ".join(tok.nlp.tokenize(as_text(caption)))


def render_golden(tok, captions):
    lines = ["# CLIP tokenizer goldens: escaped caption <TAB> 77 ids <TAB> length before truncation.",
             "# Generated by tests/reference/make_tokenizer_goldens.py (transformers 4.47.0 CLIPTokenizer,",
             "# no ftfy, SD2 tokenizer files); do not edit."]
    for c in captions:
        ids, n = reference_ids(tok, c)
        lines.append(f"{escape(c)}\t{' '.join(map(str, ids))}\t{n}")
    return ("\n".join(lines) + "\n").encode("utf-8")


def render_clean(tok, inputs):
    lines = ["# CLIP tokenizer clean-up goldens: escaped input <TAB> escaped cleaned text.",
             "# Generated by tests/reference/make_tokenizer_goldens.py (transformers 4.47.0 BasicTokenizer",
             "# as CLIPTokenizer configures it without ftfy); do not edit."]
    for c in inputs:
        lines.append(f"{escape(c)}\t{escape(reference_clean(tok, c))}")
    return ("\n".join(lines) + "\n").encode("utf-8")


# ---- randomized check against a command -----------------------------------------------------

def check_command(tok, cmd, rng, pools, n_random, exhaustive):
    cases = []
    for _ in range(n_random):
        r = rng.random()
        if r < 0.4:
            cases.append(laion_caption(rng))
        elif r < 0.9:
            cases.append(stress_string(rng, pools, 40))
        else:
            cases.append(bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 30))))
    if exhaustive:
        for cp in range(0x110000):
            if not 0xD800 <= cp <= 0xDFFF:
                c = chr(cp)
                cases.append(f"x{c}y {c}{c}z 'a{c}")
    payload = ("\n".join(escape(c) for c in cases) + "\n").encode("utf-8")
    proc = subprocess.run(cmd + " --escaped --count --file -", shell=True, input=payload,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"command failed with status {proc.returncode}: {cmd}")
    got = proc.stdout.decode().split("\n")
    bad = 0
    for i, c in enumerate(cases):
        ids, n = reference_ids(tok, c)
        want = f"{n}\t{' '.join(map(str, ids))}"
        if got[i] != want:
            bad += 1
            if bad <= 10:
                print(f"MISMATCH {escape(c)!r}\n  want {want}\n  got  {got[i]}", file=sys.stderr)
    print(f"checked {len(cases)} captions against '{cmd}': {bad} mismatches", file=sys.stderr)
    return 1 if bad else 0


# ---- main -----------------------------------------------------------------------------------

def fetch_bpe():
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", d, OPEN_CLIP],
                       check=True)
        wheel = [f for f in os.listdir(d) if f.endswith(".whl")][0]
        with zipfile.ZipFile(os.path.join(d, wheel)) as z:
            return z.read("open_clip/" + BPE_NAME)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    ap.add_argument("--fetch-bpe", action="store_true", help=f"take {BPE_NAME} from the {OPEN_CLIP} wheel")
    ap.add_argument("--check-command", metavar="CMD", help="randomized parity check against CMD")
    ap.add_argument("--random", type=int, default=20000, help="captions for --check-command (default 20000)")
    ap.add_argument("--exhaustive", action="store_true", help="with --check-command: every code point too")
    args = ap.parse_args()
    check_environment()

    bpe_path = os.path.join(DATA, BPE_NAME)
    if args.fetch_bpe:
        bpe = fetch_bpe()
    else:
        with open(bpe_path, "rb") as f:
            bpe = f.read()
    if hashlib.sha256(bpe).hexdigest() != BPE_SHA256:
        raise SystemExit(f"{BPE_NAME}: unexpected sha256 {hashlib.sha256(bpe).hexdigest()}")

    files = build_sd2_files(bpe)
    outputs = {os.path.join("sd2-base", "vocab.json.gz"): gzip_bytes(files["vocab.json"]),
               os.path.join("sd2-base", "merges.txt.gz"): gzip_bytes(files["merges.txt"]),
               os.path.join("sd2-base", "special_tokens_map.json"): files["special_tokens_map.json"],
               os.path.join("sd2-base", "tokenizer_config.json"): files["tokenizer_config.json"]}
    if args.fetch_bpe:
        outputs[BPE_NAME] = bpe

    with tempfile.TemporaryDirectory() as d:
        for name, data in files.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        tok = reference_tokenizer(d)
        captions, pools, rng = make_captions()
        if args.check_command:
            return check_command(tok, args.check_command, rng, pools, args.random, args.exhaustive)
        clean_inputs = list(captions)
        for _ in range(1500):
            clean_inputs.append(stress_string(rng, pools, 16))
        outputs["golden.tsv"] = render_golden(tok, captions)
        outputs["clean.tsv"] = render_clean(tok, clean_inputs)
        print(f"{len(captions)} golden captions, {len(clean_inputs)} clean-up cases", file=sys.stderr)

    status = 0
    for name, data in sorted(outputs.items()):
        path = os.path.join(DATA, name)
        if args.check:
            try:
                with open(path, "rb") as f:
                    same = f.read() == data
            except FileNotFoundError:
                same = False
            if not same:
                print(f"{path}: differs from what the reference produces now", file=sys.stderr)
                status = 1
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
            print(f"wrote {path} ({len(data)} bytes)", file=sys.stderr)
    if args.check and status == 0:
        print("tokenizer goldens are up to date", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
