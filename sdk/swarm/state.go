package swarm

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// stateSignaturePrefix separates state-root signatures from records'
// (signaturePrefix) and from any other use of a peer's key: a signed
// record can never pass for a signed state root, nor the reverse.
var stateSignaturePrefix = []byte("moehost-state-root:")

// ErrBadStateSignature is returned when a state root's signature does not
// verify.
var ErrBadStateSignature = errors.New("state root signature does not verify")

// SignState signs a checkpoint's state root ("sha256:<hex>") with the
// identity's key, and returns the public key (protobuf-encoded, as
// libp2p encodes it) and the signature. It implements
// host/checkpoint's Signer.
func (i *Identity) SignState(root string) (publicKey, signature []byte, err error) {
	sig, err := i.priv.Sign(append(bytes.Clone(stateSignaturePrefix), root...))
	if err != nil {
		return nil, nil, fmt.Errorf("signing state root: %w", err)
	}
	pub, err := crypto.MarshalPublicKey(i.priv.GetPublic())
	if err != nil {
		return nil, nil, fmt.Errorf("encoding public key: %w", err)
	}
	return pub, sig, nil
}

// VerifyState checks that signature signs root under publicKey, and
// returns the signer's peer ID.
func VerifyState(root string, publicKey, signature []byte) (string, error) {
	pub, err := crypto.UnmarshalPublicKey(publicKey)
	if err != nil {
		return "", fmt.Errorf("%w: public key: %v", ErrBadStateSignature, err)
	}
	id, err := peer.IDFromPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("%w: public key: %v", ErrBadStateSignature, err)
	}
	ok, err := pub.Verify(append(bytes.Clone(stateSignaturePrefix), root...), signature)
	if err != nil || !ok {
		return "", ErrBadStateSignature
	}
	return id.String(), nil
}
