"""The messages of Prime's command-session protocol that the agent serves (``Start``), built from
their descriptor in a pool of their own.

The wire contract is ``command_session/command_session.proto`` as ``prime-sandboxes`` 0.5.1
ships it (package ``command_session``, service ``CommandSession``): the field names, numbers and
types below are that file's for the messages ``Start`` uses; the other methods (``Connect``,
``List``, ``SendInput``, ``SendSignal``, ``StreamInput``, ``Update``) are not served.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
from google.protobuf.message import Message

_DESCRIPTOR = """
name: "lab/command_session.proto" package: "command_session" syntax: "proto3"
message_type {
  name: "PTY"
  field { name: "size" number: 1 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".command_session.PTY.Size" }
  nested_type {
    name: "Size"
    field { name: "cols" number: 1 label: LABEL_OPTIONAL type: TYPE_UINT32 }
    field { name: "rows" number: 2 label: LABEL_OPTIONAL type: TYPE_UINT32 }
  }
}
message_type {
  name: "CommandSpec"
  field { name: "cmd" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
  field { name: "args" number: 2 label: LABEL_REPEATED type: TYPE_STRING }
  field { name: "envs" number: 3 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".command_session.CommandSpec.EnvsEntry" }
  field { name: "cwd" number: 4 label: LABEL_OPTIONAL type: TYPE_STRING oneof_index: 0 proto3_optional: true }
  field { name: "user" number: 5 label: LABEL_OPTIONAL type: TYPE_STRING oneof_index: 1 proto3_optional: true }
  nested_type {
    name: "EnvsEntry"
    field { name: "key" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
    field { name: "value" number: 2 label: LABEL_OPTIONAL type: TYPE_STRING }
    options { map_entry: true }
  }
  oneof_decl { name: "_cwd" }
  oneof_decl { name: "_user" }
}
message_type {
  name: "StartRequest"
  field { name: "command" number: 1 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".command_session.CommandSpec" }
  field { name: "pty" number: 2 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".command_session.PTY" oneof_index: 0 proto3_optional: true }
  field { name: "stdin" number: 4 label: LABEL_OPTIONAL type: TYPE_BOOL oneof_index: 1 proto3_optional: true }
  field { name: "session_uuid" number: 5 label: LABEL_OPTIONAL type: TYPE_STRING oneof_index: 2 proto3_optional: true }
  oneof_decl { name: "_pty" }
  oneof_decl { name: "_stdin" }
  oneof_decl { name: "_session_uuid" }
}
message_type {
  name: "CommandSessionEvent"
  field { name: "start" number: 1 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".command_session.CommandSessionEvent.StartEvent" oneof_index: 0 }
  field { name: "data" number: 2 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".command_session.CommandSessionEvent.DataEvent" oneof_index: 0 }
  field { name: "end" number: 3 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".command_session.CommandSessionEvent.EndEvent" oneof_index: 0 }
  field { name: "keepalive" number: 4 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".command_session.CommandSessionEvent.KeepAlive" oneof_index: 0 }
  nested_type { name: "StartEvent" field { name: "pid" number: 1 label: LABEL_OPTIONAL type: TYPE_UINT32 } }
  nested_type {
    name: "DataEvent"
    field { name: "stdout" number: 1 label: LABEL_OPTIONAL type: TYPE_BYTES oneof_index: 0 }
    field { name: "stderr" number: 2 label: LABEL_OPTIONAL type: TYPE_BYTES oneof_index: 0 }
    field { name: "pty" number: 3 label: LABEL_OPTIONAL type: TYPE_BYTES oneof_index: 0 }
    oneof_decl { name: "output" }
  }
  nested_type {
    name: "EndEvent"
    field { name: "exit_code" number: 1 label: LABEL_OPTIONAL type: TYPE_SINT32 }
    field { name: "exited" number: 2 label: LABEL_OPTIONAL type: TYPE_BOOL }
    field { name: "status" number: 3 label: LABEL_OPTIONAL type: TYPE_STRING }
    field { name: "error" number: 4 label: LABEL_OPTIONAL type: TYPE_STRING oneof_index: 0 proto3_optional: true }
    oneof_decl { name: "_error" }
  }
  nested_type { name: "KeepAlive" }
  oneof_decl { name: "event" }
}
message_type {
  name: "StartResponse"
  field { name: "event" number: 1 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".command_session.CommandSessionEvent" }
}
"""

_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(text_format.Parse(_DESCRIPTOR, descriptor_pb2.FileDescriptorProto()))

StartRequest: type[Message] = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("command_session.StartRequest"))
StartResponse: type[Message] = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("command_session.StartResponse"))
#: The service's name on the wire: methods are POSTed to ``/<SERVICE>/<method>``.
SERVICE = "command_session.CommandSession"
