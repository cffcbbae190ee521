//go:build darwin

package main

import "golang.org/x/sys/unix"

// totalMemory is the machine's physical memory in bytes (0 if unknown).
func totalMemory() uint64 {
	n, err := unix.SysctlUint64("hw.memsize")
	if err != nil {
		return 0
	}
	return n
}
