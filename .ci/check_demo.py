#!/usr/bin/env python3
"""Checks a program's output (stdin) against the output the README shows under a section: "## The demo" unless the
section's title is given (check_demo.py "Higher-order gradients"), its last code block without a language.

Every line of the README's block must appear in the output, in order; a line ending in "..." only up to there, and a
line that is just "..." stands for any number of lines.
"""
import pathlib
import re
import sys

readme = (pathlib.Path(__file__).resolve().parent.parent / 'README.md').read_text(encoding='utf-8')
title = sys.argv[1] if len(sys.argv) > 1 else 'The demo'
section = readme.split(f'\n## {title}\n', 1)[1].split('\n## ', 1)[0]
blocks = re.findall(r'\n```(\w*)\n(.*?)\n```', section, re.S)  # (language, text)
shown = [text for language, text in blocks if not language][-1].splitlines()
output = sys.stdin.read().splitlines()

position = 0
for line in shown:
    if line == '...':
        continue
    prefix = line[:-3].rstrip() if line.endswith('...') else None
    for i in range(position, len(output)):
        if output[i] == line or (prefix is not None and output[i].startswith(prefix)):
            position = i + 1
            break
    else:
        sys.exit(f'check_demo: under "{title}" the README shows a line the program did not print (in this order):\n  {line}')
print(f'check_demo: the program printed the {sum(l != "..." for l in shown)} lines the README shows under "{title}"')
