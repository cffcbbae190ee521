package main

import (
	"fmt"

	lpeer "github.com/libp2p/go-libp2p/core/peer"
	"github.com/spf13/cobra"

	hpeer "github.com/holopeer/holopeer/peer"
)

func init() { register(newKeygenCmd) }

func newKeygenCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "keygen",
		Short: "Create a node identity (Ed25519) in a data dir and print its peer id",
		Long: `keygen writes a new Ed25519 identity key to DATA-DIR/identity.key with mode
0600. It refuses to overwrite an existing key. 'holopeer up' creates one on
first start too; keygen lets you learn the peer id beforehand.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			key, err := hpeer.CreateIdentity(dir)
			if err != nil {
				return err
			}
			id, err := lpeer.IDFromPrivateKey(key)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), id)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "data-dir", defaultDataDir(), "directory for the identity key")
	return cmd
}
