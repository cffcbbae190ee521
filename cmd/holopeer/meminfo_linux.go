//go:build linux

package main

import "golang.org/x/sys/unix"

// totalMemory is the machine's physical memory in bytes (0 if unknown).
func totalMemory() uint64 {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0
	}
	return uint64(si.Totalram) * uint64(si.Unit)
}
