//go:build !linux

package netem

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
)

// Link is unavailable off Linux.
type Link struct {
	NS   [2]string
	Addr [2]netip.Addr
	Mode string
	Cfg  Config
}

// Available reports that network namespaces need Linux.
func Available() error { return fmt.Errorf("%w: network namespaces need Linux", ErrUnavailable) }

// Setup fails off Linux.
func Setup(context.Context, Config) (*Link, error) { return nil, Available() }

func (l *Link) Command(ctx context.Context, _ int, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, name, args...)
}

func (l *Link) Close() error { return nil }

func (l *Link) Measure(context.Context, []string, Run) (Result, error) { return Result{}, Available() }

// PeerMain fails off Linux.
func PeerMain(context.Context, io.Writer) error { return Available() }
