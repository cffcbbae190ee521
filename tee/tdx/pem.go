package tdx

import (
	"encoding/pem"
	"errors"
)

func pemDER(b []byte) ([]byte, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return block.Bytes, nil
}
