package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/holopeer/holopeer/stage/tensor"
)

func TestOpenDevice(t *testing.T) {
	be, msg, err := openDevice("cpu")
	if err != nil || be.Name() != "cpu" {
		t.Fatalf("openDevice(cpu) = %v, %q, %v", be, msg, err)
	}
	if _, _, err := openDevice("gpu"); err == nil || !strings.Contains(err.Error(), "auto, cpu, cuda, metal") {
		t.Fatalf("openDevice(gpu) error = %v, want the list of devices", err)
	}
	// Whatever this binary was built with, a GPU that does not open falls
	// back to cpu and the message names it and says why.
	for _, name := range []string{"auto", "cuda", "metal"} {
		be, msg, err := openDevice(name)
		if err != nil {
			t.Fatalf("openDevice(%s): %v", name, err)
		}
		t.Logf("--device %s: %s", name, msg)
		if be.Name() != "cpu" {
			continue // a GPU opened here
		}
		if name != "auto" && !strings.Contains(msg, name+" unavailable") && !strings.Contains(msg, name+" is not built into") {
			t.Errorf("--device %s fell back to cpu without saying why: %q", name, msg)
		}
		for _, n := range tensor.Backends() {
			if name == "auto" && n != "cpu" && !strings.Contains(msg, n) {
				t.Errorf("--device auto fell back to cpu; the message %q does not say why %s did not open", msg, n)
			}
		}
	}
}

func TestMeasureGFLOPS(t *testing.T) {
	be, _, err := openDevice("cpu")
	if err != nil {
		t.Fatal(err)
	}
	gf, err := measureGFLOPS(context.Background(), be, 64, time.Millisecond)
	if err != nil || !(gf > 0) {
		t.Fatalf("measureGFLOPS = %v, %v", gf, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := measureGFLOPS(ctx, be, 64, time.Hour); err == nil {
		t.Fatal("measureGFLOPS ignored a cancelled context")
	}
}

func TestDeviceCommand(t *testing.T) {
	var out bytes.Buffer
	cmd := newDeviceCmd()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--device", "auto", "--time", "1ms"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"backends ", "device auto → ", "GFLOP/s"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	t.Log(out.String())
}
