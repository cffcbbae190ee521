//go:build !unix

package main

import "os"

// peakRSS is not measured where getrusage does not exist.
func peakRSS(*os.ProcessState) int64 { return 0 }
