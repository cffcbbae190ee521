// Package testnet holds the example job manifests, embedded so that the
// binary can run its demo (`holopeer testnet`) from any directory. The
// scripts for container and NAT testnets live beside it.
package testnet

import "embed"

// Manifests are the example manifests (*.yaml in this directory).
//
//go:embed *.yaml
var Manifests embed.FS

// Demo is the job `holopeer testnet` trains.
const Demo = "demo.yaml"
