package wire

import (
	"errors"
	"fmt"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
)

// Error is an error with a wire ErrorCode. Every response's (code, message) pair maps
// to and from one of these.
type Error struct {
	Code common.ErrorCode
	Msg  string
}

func (e *Error) Error() string {
	if e.Msg == "" {
		return e.Code.String()
	}
	return e.Code.String() + ": " + e.Msg
}

// Is makes errors.Is(err, ErrKeyNotFound) and friends match on the code alone.
func (e *Error) Is(target error) bool {
	var t *Error
	if errors.As(target, &t) {
		return t.Code == e.Code && t.Msg == ""
	}
	return false
}

// Sentinels to compare with errors.Is; a response error matches the sentinel of its code.
var (
	ErrKeyNotFound      = &Error{Code: common.ErrorCode_KEY_NOT_FOUND}
	ErrNoSpace          = &Error{Code: common.ErrorCode_NO_SPACE}
	ErrInvalidArgument  = &Error{Code: common.ErrorCode_INVALID_ARGUMENT}
	ErrAlreadyExists    = &Error{Code: common.ErrorCode_ALREADY_EXISTS}
	ErrBusy             = &Error{Code: common.ErrorCode_BUSY}
	ErrStaleGeneration  = &Error{Code: common.ErrorCode_STALE_GENERATION}
	ErrUnavailable      = &Error{Code: common.ErrorCode_UNAVAILABLE}
	ErrInternal         = &Error{Code: common.ErrorCode_INTERNAL}
	ErrPermissionDenied = &Error{Code: common.ErrorCode_PERMISSION_DENIED}
)

// ConnectDenied is the error for a connect(2) to an owner socket refused with EACCES:
// the socket's mode and group keep the caller out before the owner hears of it.
func ConnectDenied(path string, err error) *Error {
	return Errorf(common.ErrorCode_PERMISSION_DENIED, "cannot connect to %s: %v: the socket admits its owner and "+
		"members of its group (see `ls -l %s`); add the user with `usermod -aG GROUP USER` (it takes effect at the user's next login)", path, err, path)
}

// Errorf builds an *Error with a formatted message.
func Errorf(code common.ErrorCode, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// FromResponse turns a response's (code, message) into an error; nil for OK.
func FromResponse(code common.ErrorCode, msg string) error {
	if code == common.ErrorCode_OK {
		return nil
	}
	return &Error{Code: code, Msg: msg}
}

// ToResponse splits an error into the (code, message) pair every response carries.
// Errors that carry no code are INTERNAL.
func ToResponse(err error) (common.ErrorCode, string) {
	if err == nil {
		return common.ErrorCode_OK, ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code, e.Msg
	}
	return common.ErrorCode_INTERNAL, err.Error()
}

// CodeOf returns the wire code of err (OK for nil, INTERNAL when it carries none).
func CodeOf(err error) common.ErrorCode {
	c, _ := ToResponse(err)
	return c
}
