#!/usr/bin/env python3
"""Checks the demo's output (stdin) against the output the README shows under "## The demo".

Every line of the README's block must appear in the output, in order; a line ending in "..." only up to there, and a
line that is just "..." stands for any number of lines.
"""
import pathlib
import re
import sys

readme = (pathlib.Path(__file__).resolve().parent.parent / 'README.md').read_text(encoding='utf-8')
section = readme.split('\n## The demo\n', 1)[1].split('\n## ', 1)[0]
shown = re.search(r'\n```\n(.*?)\n```', section, re.S).group(1).splitlines()
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
        sys.exit(f'check_demo: the README shows a line the demo did not print (in this order):\n  {line}')
print(f'check_demo: the demo printed the {sum(l != "..." for l in shown)} lines the README shows')
