//go:build race

package election

// raceEnabled: the race detector slows this package ~10×; the chaos test
// runs one seed instead of four under it.
const raceEnabled = true
