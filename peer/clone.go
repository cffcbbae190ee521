package peer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	lpeer "github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	msmux "github.com/multiformats/go-multistream"
)

// Two processes started from one identity (a copied data dir, a cloned VM)
// confuse every peer that talks to them. A node cannot dial itself, so it
// asks a third party: "how many different processes hold connections as my
// peer ID?". The third party asks each of those connections for its random
// instance id (instanceProtocol) and answers with what it heard
// (cloneCheckProtocol).
const (
	instanceProtocol   protocol.ID = "/holopeer/instance/1.0.0"
	cloneCheckProtocol protocol.ID = "/holopeer/clone-check/1.0.0"
	maxCloneConns                  = 8
	instanceLen                    = 16 + 8
)

// ErrClone is returned by New when another live process already runs with
// this node's identity.
var ErrClone = errors.New("another process is already running with this identity")

type instanceInfo struct {
	ID      [16]byte
	Started time.Time
}

func (i instanceInfo) marshal() []byte {
	b := make([]byte, instanceLen)
	copy(b, i.ID[:])
	binary.BigEndian.PutUint64(b[16:], uint64(i.Started.UnixNano()))
	return b
}

func unmarshalInstance(b []byte) (instanceInfo, error) {
	if len(b) != instanceLen {
		return instanceInfo{}, fmt.Errorf("instance record of %d bytes, want %d", len(b), instanceLen)
	}
	var i instanceInfo
	copy(i.ID[:], b)
	i.Started = time.Unix(0, int64(binary.BigEndian.Uint64(b[16:])))
	return i, nil
}

func (n *Host) serveInstance(s network.Stream) {
	_ = s.SetDeadline(time.Now().Add(streamTimeout))
	if _, err := s.Write(n.instance.marshal()); err != nil {
		s.Reset()
		return
	}
	s.Close()
}

// serveCloneCheck answers with the distinct instances behind the caller's
// peer ID, asked over each of its connections.
func (n *Host) serveCloneCheck(s network.Stream) {
	_ = s.Scope().SetService("holopeer.clone-check")
	_ = s.SetDeadline(time.Now().Add(streamTimeout))
	ctx, cancel := context.WithTimeout(n.ctx, streamTimeout/2)
	defer cancel()
	conns := s.Conn().RemotePeer()
	seen := map[[16]byte]instanceInfo{}
	for i, c := range n.h.Network().ConnsToPeer(conns) {
		if i == maxCloneConns {
			break
		}
		info, err := askInstance(ctx, c)
		if err != nil {
			continue
		}
		seen[info.ID] = info
	}
	var out []byte
	out = append(out, byte(len(seen)))
	for _, info := range seen {
		out = append(out, info.marshal()...)
	}
	if _, err := s.Write(out); err != nil {
		s.Reset()
		return
	}
	s.Close()
}

// askInstance opens a stream on one specific connection, so that each of
// several same-ID connections is asked separately.
func askInstance(ctx context.Context, c network.Conn) (instanceInfo, error) {
	s, err := c.NewStream(ctx)
	if err != nil {
		return instanceInfo{}, err
	}
	defer s.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = s.SetDeadline(dl)
	}
	if err := s.SetProtocol(instanceProtocol); err != nil {
		s.Reset()
		return instanceInfo{}, err
	}
	if err := msmux.SelectProtoOrFail(instanceProtocol, s); err != nil {
		s.Reset()
		return instanceInfo{}, err
	}
	b := make([]byte, instanceLen)
	if _, err := io.ReadFull(s, b); err != nil {
		s.Reset()
		return instanceInfo{}, err
	}
	return unmarshalInstance(b)
}

// clonesSeenBy asks p which instances it sees behind our peer ID and
// returns those that are not us.
func (n *Host) clonesSeenBy(ctx context.Context, p lpeer.ID) ([]instanceInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, streamTimeout)
	defer cancel()
	s, err := n.h.NewStream(network.WithAllowLimitedConn(ctx, "clone-check"), p, cloneCheckProtocol)
	if err != nil {
		return nil, err
	}
	_ = s.SetDeadline(time.Now().Add(streamTimeout))
	var cnt [1]byte
	if _, err := io.ReadFull(s, cnt[:]); err != nil {
		s.Reset()
		return nil, err
	}
	if cnt[0] > maxCloneConns {
		s.Reset()
		return nil, fmt.Errorf("clone check: %d instances exceeds %d", cnt[0], maxCloneConns)
	}
	b := make([]byte, int(cnt[0])*instanceLen)
	if _, err := io.ReadFull(s, b); err != nil {
		s.Reset()
		return nil, err
	}
	s.Close()
	var others []instanceInfo
	for i := 0; i < int(cnt[0]); i++ {
		info, err := unmarshalInstance(b[i*instanceLen : (i+1)*instanceLen])
		if err != nil {
			return nil, err
		}
		if info.ID != n.instance.ID {
			others = append(others, info)
		}
	}
	return others, nil
}

// checkClones asks up to three connected peers at start-up and refuses to
// run when any of them sees another live instance of our identity.
func (n *Host) checkClones(ctx context.Context) error {
	peers := n.h.Network().Peers()
	rand.Shuffle(len(peers), func(i, j int) { peers[i], peers[j] = peers[j], peers[i] })
	asked := 0
	for _, p := range peers {
		if asked == 3 {
			break
		}
		others, err := n.clonesSeenBy(ctx, p)
		if err != nil {
			n.log.Debug("clone check failed", "peer", p, "err", err)
			continue
		}
		asked++
		if len(others) > 0 {
			return fmt.Errorf("%w: peer %s sees %s live (that process started %s); stop it, or give this node its own --data-dir",
				ErrClone, p, n.h.ID(), others[0].Started.Format(time.RFC3339))
		}
	}
	return nil
}
