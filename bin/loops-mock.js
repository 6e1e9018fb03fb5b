#!/bin/sh
":" //; exec env MALLOC_MMAP_THRESHOLD_=1048576 node --expose-gc "$0" "$@"
// The loops-mock command. Read by sh, the line above starts this file again under node with two runtime
// settings, in place of the shell (the same process id: signals and kill -9 reach the server); read by node,
// it is a string and a comment. The settings give memory back to the system after a burst (docs/engine.md,
// "Long sequences and memory"): buffers from 1 MB up get pages of their own (glibc otherwise keeps freed
// multi-MB buffers in its heap for good), and gc lets the server collect right after runs stop and long
// requests end (models/collect-soon.ts). Plain POSIX sh and env, so busybox (Alpine) runs it too.
import '../dist/server/cli.js';
