//go:build unix && !linux

package main

import "syscall"

// setDeathSignal has no portable equivalent outside Linux: t.Cleanup kills
// the process groups.
func setDeathSignal(*syscall.SysProcAttr) {}
