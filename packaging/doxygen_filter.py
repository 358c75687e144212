#!/usr/bin/env python3
"""Doxygen's filter for tapegrad's headers (FILTER_PATTERNS in Doxyfile.in): their plain `//` comments made
documentation, on the fly.

usage: doxygen_filter.py <header>    (writes the filtered header to stdout; the file itself is not changed)

tapegrad's headers document their API in plain `//` comments, which Doxygen ignores. This filter rewrites, keeping
every line where it was (so that Doxygen's line numbers stay the source's):
- the file's top comment block into the file's description (`/// ... \\file`);
- a run of `//` lines directly above a declaration at namespace, class or enum scope into `///` lines;
- a trailing `// ...` after a member, an enumerator or a declaration on the same line into `///< ...`, and the
  `//` lines that continue it in the same column into `///<` lines;
- an indented block inside such a comment (after a blank comment line: a code example, a formula, a table) into a
  \\code block that keeps its layout;
- a specialization of another library's template (Eigen's traits) into code Doxygen skips (\\cond ... \\endcond).
Comments inside function bodies, comments followed by a blank line (section notes) and comments above anything that is
not a declaration (an access specifier, a closing brace, an #include, a static_assert) stay plain. The text of a
converted comment has Doxygen's special characters escaped outside `code spans` and "quotes", so that `Tensor<T>`,
`@`, `#` or a backslash read as written rather than as HTML or commands. If the filter fails it prints a warning in
Doxygen's format (file:line: warning: ...) and passes the header through unchanged.
"""
import re
import sys

SCOPE_HEAD = re.compile(r'^(?:\[\[[^\]]*\]\]\s*)*(?:export\s+)?(?:inline\s+)?'
                        r'(?:namespace\b|class\b|struct\b|union\b|enum\b|extern\s+"C")')
TEMPLATE_PREFIX = re.compile(r'^\s*template\s*<')
NOT_A_DECLARATION = re.compile(r'^\s*(?:$|}|(?:public|private|protected)\s*:|static_assert\b|extern\s+template\b'
                               r'|#\s*(?!define\b)|namespace\b[^{]*$)')
FOREIGN_SPECIALIZATION = re.compile(r'^\s*(?:template\s*<.*>\s*)?(?:struct|class)\s+(?:std|Eigen)::')
SPECIAL = re.compile(r'([\\@<>&#%$])')


def strip_template_prefix(head):
    """`template <class T, ...> rest` -> `rest` (balanced angle brackets), repeatedly."""
    while TEMPLATE_PREFIX.match(head):
        start = head.index('<')
        depth = 0
        for i in range(start, len(head)):
            if head[i] == '<':
                depth += 1
            elif head[i] == '>':
                depth -= 1
                if depth == 0:
                    head = head[i + 1:]
                    break
        else:
            return head
    return head.strip()


class Line:
    """What the scanner learned about one source line."""

    def __init__(self):
        self.comment_only = False   # the line is a `//` comment and nothing else
        self.comment_col = -1       # column of a `//` comment on the line, -1 if none
        self.code = ''              # the line's code, comments and literals' contents removed
        self.in_body = False        # the line starts inside a function body (or an initializer)
        self.at_statement_start = True  # nothing of a declaration is pending when the line starts
        self.paren_start = 0        # parenthesis depth when the line starts
        self.paren_end = 0          # ... and when it ends
        self.opens_body = False     # the line leaves a brace open that is no scope
        self.depth_end = 0          # braces open when the line ends


def scan(lines):
    """One pass over the file: comments, literals, braces (scopes vs bodies) and the pending statement's head."""
    info = []
    stack = []         # True for a scope brace (namespace, class, enum...), False for a body or an initializer
    head = ''          # code since the last ; { } or access specifier
    parens = 0
    in_block = False   # inside /* ... */
    in_macro = False   # on a continuation line of a preprocessor directive
    for text in lines:
        line = Line()
        line.in_body = not all(stack)
        line.at_statement_start = head.strip() == '' and parens == 0
        line.paren_start = parens
        stripped = text.lstrip()
        if not in_block and stripped.startswith('//'):
            line.comment_only = True
            line.comment_col = len(text) - len(stripped)
            line.paren_end = parens
            line.depth_end = len(stack)
            info.append(line)
            continue
        if in_macro or (not in_block and stripped.startswith('#')):
            in_macro = text.rstrip().endswith('\\')
            line.code = '#' + stripped
            line.paren_end = parens
            line.depth_end = len(stack)
            info.append(line)
            continue
        depth_at_start = len(stack)
        code = []
        i = 0
        n = len(text)
        while i < n:
            c = text[i]
            if in_block:
                if text.startswith('*/', i):
                    in_block = False
                    i += 2
                else:
                    i += 1
                continue
            if text.startswith('//', i):
                line.comment_col = i
                break
            if text.startswith('/*', i):
                in_block = True
                i += 2
                continue
            if c in '"\'':
                # a literal: skip to its closing quote (raw strings are not used in these headers)
                j = i + 1
                while j < n and text[j] != c:
                    j += 2 if text[j] == '\\' else 1
                code.append(c + c)
                i = j + 1
                continue
            code.append(c)
            if c == '(':
                parens += 1
            elif c == ')':
                parens = max(0, parens - 1)
            elif c == '{':
                is_scope = all(stack) and bool(SCOPE_HEAD.match(strip_template_prefix(head.strip())))
                stack.append(is_scope)
                head = ''
            elif c == '}':
                if stack:
                    stack.pop()
                head = ''
            elif c == ';':
                head = ''
            else:
                head += c
            i += 1
        line.code = ''.join(code)
        if re.match(r'^\s*(?:public|private|protected)\s*:\s*$', line.code):
            head = ''
        else:
            head += ' '
        line.paren_end = parens
        line.opens_body = len(stack) > depth_at_start and not all(stack)
        line.depth_end = len(stack)
        info.append(line)
    return info


def escape(text):
    """Doxygen's special characters escaped outside `code spans` and "quoted text", which Doxygen shows as written.
    Both are paired from the left within the line, as Doxygen pairs them; an unpaired mark quotes nothing."""
    def outside(text, mark, inner):
        parts = text.split(mark)
        paired = len(parts) if len(parts) % 2 else len(parts) - 1  # parts[paired:] follow an unpaired mark
        out = [part if k % 2 and k < paired else inner(part) for k, part in enumerate(parts)]
        return mark.join(out)

    return outside(text, '`', lambda part: outside(part, '"', lambda plain: SPECIAL.sub(r'\\\1', plain)))


def as_doc(text, marker, verbatim=False):
    """`  // words` -> `  <marker> words`, escaped unless it is verbatim."""
    col = text.index('//')
    body = text[col + 2:]
    return text[:col] + marker + (body if verbatim else escape(body))


def convert_run(lines, out, first, end, marker):
    """Comment lines [first, end) as documentation. An indented block after a blank comment line (a code example, a
    formula, an aligned table) keeps its layout as a code block: \\code goes on the blank line (with {.unparsed}
    unless the block reads as C++) and \\endcode at the end of the block's last line."""
    def text_of(k):
        return lines[k][lines[k].index('//') + 2:]

    def indented(k):
        return text_of(k).startswith('   ') and text_of(k).strip() != ''

    k = first
    while k < end:
        if indented(k) and k > first and text_of(k - 1).strip() == '':
            last = k
            while last + 1 < end and (indented(last + 1) or (text_of(last + 1).strip() == '' and last + 2 < end
                                                               and indented(last + 2))):
                last += 1
            block = [text_of(m).split('//')[0].rstrip() for m in range(k, last + 1)]
            cpp = any(line.endswith((';', '{', '}')) for line in block)
            out[k - 1] = as_doc(lines[k - 1], marker) + (' \\code' if cpp else ' \\code{.unparsed}')
            for m in range(k, last + 1):
                out[m] = as_doc(lines[m], marker, verbatim=True)
            out[last] += ' \\endcode'
            k = last + 1
            continue
        out[k] = as_doc(lines[k], marker)
        k += 1


def trailing_ok(line):
    """A trailing comment documents the line's member when the line is a whole declaration at scope level."""
    if line.in_body or line.opens_body or line.paren_start or line.paren_end or not line.at_statement_start:
        return False
    code = line.code.strip()
    if not code or NOT_A_DECLARATION.match(code) or code.startswith('#'):
        return False
    return code.endswith((';', ',', '}')) or re.fullmatch(r'[A-Za-z_]\w*(?:\s*=\s*[^;{}]+)?', code) is not None


def filter_text(source):
    lines = source.split('\n')
    info = scan(lines)
    out = list(lines)
    n = len(lines)

    # The top comment block: the file's description.
    first = 0
    while first < n and not lines[first].strip():
        first += 1
    top_end = first
    while top_end < n and info[top_end].comment_only:
        top_end += 1
    if top_end > first:
        convert_run(lines, out, first, top_end, '///')
        out[top_end - 1] += ' \\file'

    # Specializations of another library's templates (Eigen's traits, std::hash...) are no part of tapegrad's API,
    # and Doxygen cannot place them: hidden between \cond and \endcond (put on their first and last lines).
    foreign = set()
    for k in range(top_end, n):
        if FOREIGN_SPECIALIZATION.match(lines[k]) and not info[k].in_body:
            first_line = k - 1 if k > 0 and lines[k - 1].lstrip().startswith('template') else k
            depth = info[first_line - 1].depth_end if first_line > 0 else 0
            last = k
            while last < n - 1 and (info[last].depth_end > depth or ';' not in info[last].code):
                last += 1
            out[first_line] = '/** \\cond */ ' + lines[first_line]
            out[last] = lines[last] + ' /** \\endcond */'
            foreign.update(range(first_line, last + 1))

    k = top_end
    while k < n:
        line = info[k]
        if k in foreign:
            k += 1
            continue
        if line.comment_col >= 0 and not line.comment_only:
            # a trailing comment, and the comment lines that continue it in its column
            # (a comment that stays plain keeps its continuation lines plain too)
            documents = trailing_ok(line) and not lines[k][line.comment_col + 2:].lstrip().startswith('NOLINT')
            if documents:
                out[k] = as_doc(lines[k], '///<')
            j = k + 1
            while j < n and info[j].comment_only and info[j].comment_col == line.comment_col:
                if documents:
                    out[j] = as_doc(lines[j], '///<')
                j += 1
            k = j
            continue
        if not line.comment_only:
            k += 1
            continue
        # a run of comment lines
        j = k
        while j < n and info[j].comment_only:
            j += 1
        nxt = info[j] if j < n else None
        if (nxt is not None and j not in foreign and not line.in_body and line.at_statement_start
                and line.paren_start == 0 and not NOT_A_DECLARATION.match(lines[j])
                and not lines[k].lstrip().startswith('///')):
            convert_run(lines, out, k, j, '///')
        k = j
    return '\n'.join(out)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.split('\n\n')[1])
    with open(sys.argv[1], encoding='utf-8') as f:
        source = f.read()
    try:
        sys.stdout.write(filter_text(source))
    except Exception as e:  # a Doxygen-style warning (which .ci/docs counts), and the header unfiltered
        print(f'{sys.argv[1]}:1: warning: doxygen_filter.py failed ({type(e).__name__}: {e}); the header is read '
              'without its documentation', file=sys.stderr)
        sys.stdout.write(source)


if __name__ == '__main__':
    main()
