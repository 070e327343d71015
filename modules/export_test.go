package modules

// CrashAfterBytes makes the next uploads stop, as a crash would, after the
// module's bytes are in place and before the index refers to them.
func CrashAfterBytes(s *Store, err error) { s.afterBytes = func() error { return err } }

// DecodeIndex exposes the index decoder to the fuzz target.
func DecodeIndex(b []byte) (int, error) {
	m, err := decodeIndex(b)
	return len(m), err
}

// RoundTripIndex decodes b, encodes what it got and decodes that again,
// returning both decodings' lengths and whether they are equal.
func RoundTripIndex(b []byte) (bool, error) {
	m, err := decodeIndex(b)
	if err != nil {
		return false, err
	}
	e, err := encodeIndex(m)
	if err != nil {
		return false, err
	}
	m2, err := decodeIndex(e)
	if err != nil || len(m2) != len(m) {
		return false, err
	}
	for i := range m {
		if m[i].tenant != m2[i].tenant || m[i].Digest != m2[i].Digest || m[i].Name != m2[i].Name ||
			m[i].Size != m2[i].Size || !m[i].Uploaded.Equal(m2[i].Uploaded) {
			return false, nil
		}
	}
	return true, nil
}
