#!/usr/bin/env python3
"""Runs tests/dist_failures.cpp's job under mpirun and checks that a hung or dead rank ends the job within seconds:
with the others' CommunicationError naming the collective and the silent rank (hang, exit code 124), or with mpirun
ending them (die).

usage: dist_failures.py <mpirun> <ranks> <dist_failures executable> hang|die
"""
import subprocess
import sys
import time

mpirun, ranks, program, mode = sys.argv[1:5]
command = [mpirun, '--allow-run-as-root', '--oversubscribe', '-np', ranks, program, mode]
start = time.monotonic()
try:
    run = subprocess.run(command, capture_output=True, text=True, timeout=60)
except subprocess.TimeoutExpired:
    sys.exit(f'FAIL: {mode}: the job still ran after 60 s')
seconds = time.monotonic() - start
output = run.stdout + run.stderr
print(output)
print(f'{mode}: exit code {run.returncode} after {seconds:.1f} s')
problems = []
if seconds > 20:
    problems.append(f'took {seconds:.1f} s (at most 20 expected)')
last = int(ranks) - 1
if mode == 'hang':
    if run.returncode != 124:
        problems.append(f'exit code {run.returncode}, not 124 (the Session\'s MPI_Abort)')
    for rank in range(last):
        expected = (f"rank {rank} caught: communicator 'world' (rank {rank} of {ranks}): all_reduce (call 0) of f32 "
                    f"[1024] on cpu: not every rank took part within 2 s (rank {last} did not answer")
        if expected not in output:
            problems.append(f'no line "{expected}"')
        if f'rank {rank} then caught:' not in output or 'cannot be used again' not in output:
            problems.append(f'rank {rank}: no error from the barrier after the failure')
else:
    if run.returncode == 0:
        problems.append('exit code 0 although a rank was killed')
    if 'returned without the last rank' in output:
        problems.append('a collective returned without the dead rank')
if problems:
    sys.exit('FAIL: ' + '; '.join(problems))
print('OK')
