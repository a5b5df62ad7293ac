package main

import "syscall"

// setDeathSignal makes the kernel kill a test's kvfence process if the test
// process dies first (a timeout panic skips t.Cleanup).
func setDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
